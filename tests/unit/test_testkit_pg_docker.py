"""Where the tests' PostgreSQL comes from (ACKKIT_TEST_POSTGRES), which image the Docker
way runs, and that the container's generated password never shows: no Docker needed
(the container class is a stand-in that records what the kit asked of it)."""

from __future__ import annotations

import pathlib
from typing import Any

import pytest

from ackkit.testing import BrokerUnavailable, _pg
from ackkit_testkit import _postgres
from ackkit_testkit import _provider_pg_docker as pgd
from ackkit_testkit._pg_image import local_pg_image_version, postgres_version_in

BIN = "/usr/lib/postgresql/15/bin"


def _engine(ok: bool) -> Any:
    asked: list[int] = []

    def probe() -> tuple[bool, str]:
        asked.append(1)
        return ok, "" if ok else "no Docker engine answers (test)"

    probe.asked = asked  # type: ignore[attr-defined]
    return probe


@pytest.mark.parametrize(
    ("mode", "dsn", "binaries", "engine_ok", "way"),
    [
        ("auto", "postgresql://x@h/db", BIN, True, "dsn"),
        ("auto", "", BIN, True, "own"),  # the binaries before a container: faster
        ("auto", "", None, True, "docker"),
        ("dsn", "postgresql://x@h/db", None, False, "dsn"),
        ("own", "postgresql://x@h/db", BIN, True, "own"),  # a forced way wins over the DSN
        ("docker", "postgresql://x@h/db", BIN, True, "docker"),
    ],
)
def test_the_way_to_postgres(
    mode: str, dsn: str, binaries: str | None, engine_ok: bool, way: str
) -> None:
    probe = _engine(engine_ok)
    assert _postgres.choose_postgres(mode, dsn=dsn, binaries=binaries, engine=probe) == way
    assert bool(probe.asked) == (way == "docker")  # the engine is probed only when needed


@pytest.mark.parametrize(
    ("mode", "dsn", "binaries", "says"),
    [
        ("auto", "", None, ["ACKKIT_TEST_POSTGRES_DSN: not set", "no Docker engine answers"]),
        ("docker", "", BIN, ["ACKKIT_TEST_POSTGRES=docker but no Docker engine answers"]),
        ("own", "", None, ["ACKKIT_TEST_POSTGRES=own but no PostgreSQL server binaries"]),
        ("dsn", "", BIN, ["ACKKIT_TEST_POSTGRES=dsn but ACKKIT_TEST_POSTGRES_DSN is not set"]),
    ],
)
def test_no_way_to_postgres_says_what_to_do(
    mode: str, dsn: str, binaries: str | None, says: list[str]
) -> None:
    with pytest.raises(_postgres.PostgresUnavailable) as info:
        _postgres.choose_postgres(mode, dsn=dsn, binaries=binaries, engine=_engine(False))
    for text in says:
        assert text in str(info.value)


def test_the_mode_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACKKIT_TEST_POSTGRES", " Docker ")
    assert _postgres.postgres_mode() == "docker"
    assert _postgres.postgres_mode("own") == "own"
    monkeypatch.setenv("ACKKIT_TEST_POSTGRES", "podman")
    with pytest.raises(ValueError, match="auto, dsn, own, docker"):
        _postgres.postgres_mode()
    with pytest.raises(ValueError, match="ACKKIT_TEST_POSTGRES"):
        _pg.provision_postgres()


def test_the_fixture_way_hands_a_forced_mode_to_the_testkit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    asked: list[str] = []

    class Kit:
        @staticmethod
        def provision_postgres(mode: str) -> str:
            asked.append(mode)
            return "kit"

    monkeypatch.setattr(_pg._kit, "require", lambda *a, **k: Kit)
    monkeypatch.setenv("ACKKIT_TEST_POSTGRES_DSN", "postgresql://u:pw@db.invalid/x")
    monkeypatch.setenv("ACKKIT_TEST_POSTGRES", "auto")
    assert isinstance(_pg.provision_postgres(), _pg.ExternalPostgres)
    monkeypatch.setenv("ACKKIT_TEST_POSTGRES", "docker")
    assert _pg.provision_postgres() == "kit"
    monkeypatch.delenv("ACKKIT_TEST_POSTGRES_DSN")
    with pytest.raises(ValueError, match="ACKKIT_TEST_POSTGRES_DSN is not set"):
        _pg.provision_postgres("dsn")
    assert _pg.provision_postgres("auto") == "kit"
    assert asked == ["docker", "auto"]


@pytest.mark.parametrize(
    ("explicit", "network", "kit_exists", "image"),
    [
        ("", "host", False, ("ackkit-test/postgres:17", True)),  # no registry: build ours
        ("", "bridge", False, ("postgres:17", False)),  # a usual engine: the official one
        ("", "bridge", True, ("ackkit-test/postgres:17", True)),
        ("postgres:16-alpine", "host", True, ("postgres:16-alpine", False)),
        ("ackkit-test/postgres:15", "bridge", False, ("ackkit-test/postgres:15", True)),
    ],
)
def test_which_image(
    explicit: str, network: str, kit_exists: bool, image: tuple[str, bool]
) -> None:
    assert pgd.pg_image_choice(explicit, network, kit_exists) == image


def test_the_kits_image_is_built_when_it_is_chosen(monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[str] = []
    monkeypatch.setattr(pgd, "image_exists", lambda client, name: False)
    monkeypatch.setattr(pgd, "ensure_pg_image", lambda c, v: built.append(v) or f"kit:{v}")
    monkeypatch.delenv("ACKKIT_TEST_POSTGRES_IMAGE", raising=False)
    assert pgd.choose_pg_image(None, "bridge") == "postgres:17"
    assert pgd.choose_pg_image(None, "host") == "kit:17"
    monkeypatch.setenv("ACKKIT_TEST_POSTGRES_IMAGE", "ackkit-test/postgres:15")
    assert pgd.choose_pg_image(None, "bridge") == "kit:15"
    assert built == ["17", "15"]


class _Wrapped:
    status = "running"

    def reload(self) -> None:
        pass


class _Container:
    """Stands in for testcontainers' DockerContainer; ``fail`` makes start() raise it."""

    made: list[_Container] = []
    fail: str | None = None

    def __init__(self, image: str) -> None:
        self.image, self.env, self.kwargs, self.ports = image, {}, {}, {}
        self.command: list[str] | None = None
        self.logs = b""
        self.stopped = False
        _Container.made.append(self)

    def with_name(self, name: str) -> None:
        self.name = name

    def with_env(self, key: str, value: str) -> None:
        self.env[key] = value

    def with_kwargs(self, **kwargs: Any) -> None:
        self.kwargs.update(kwargs)

    def with_command(self, command: list[str]) -> None:
        self.command = command

    def with_exposed_ports(self, port: int) -> None:
        self.ports[port] = None

    def start(self) -> None:
        self.logs = f"password {self.env['POSTGRES_PASSWORD']} set\n".encode()
        if _Container.fail:
            raise RuntimeError(_Container.fail.format(pw=self.env["POSTGRES_PASSWORD"]))

    def get_wrapped_container(self) -> _Wrapped:
        return _Wrapped()

    def get_logs(self) -> tuple[bytes, bytes]:
        return self.logs, b""

    def stop(self) -> None:
        self.stopped = True


@pytest.fixture
def stand_in(monkeypatch: pytest.MonkeyPatch) -> type[_Container]:
    _Container.made, _Container.fail = [], None
    monkeypatch.setattr(pgd.DockerPostgres, "_answers", lambda self: True)
    monkeypatch.delenv("DOCKER_HOST", raising=False)
    return _Container


def test_the_password_is_generated_and_never_shown(stand_in: type[_Container]) -> None:
    pg = pgd.DockerPostgres("ackkit-test/postgres:17", "host", container_class=stand_in)
    other = pgd.DockerPostgres("ackkit-test/postgres:17", "host", container_class=stand_in)
    try:
        (made, _) = stand_in.made
        password = made.env["POSTGRES_PASSWORD"]
        assert len(password) >= 32 and password != other.dsn.split(":")[2].split("@")[0]
        assert f"postgres:{password}@127.0.0.1:{made.env['PGPORT']}/postgres" in pg.dsn
        assert password not in repr(pg) and "***" in repr(pg)
        assert password in made.logs.decode() and password not in str(pg.log_text())
        # host network, loopback only; the kit's image brings its own command
        assert made.kwargs == {"network_mode": "host"} and made.command is None
        assert made.name.startswith("ackkit-test-")
    finally:
        pg.close()
        other.close()
    assert made.stopped


def test_the_official_image_on_a_bridge_listens_on_a_published_loopback_port(
    stand_in: type[_Container],
) -> None:
    pg = pgd.DockerPostgres("postgres:17", "bridge", container_class=stand_in)
    (made,) = stand_in.made
    assert made.kwargs == {}
    (published,) = made.ports.values()
    assert published[0] == "127.0.0.1" and pg.dsn.endswith(f"@127.0.0.1:{published[1]}/postgres")
    assert made.command == ["postgres", "-c", "fsync=off"]
    pg.close()
    with pytest.raises(RuntimeError, match="closed"):
        pg.start()


def test_a_container_that_does_not_start_hides_the_password(stand_in: type[_Container]) -> None:
    stand_in.fail = "500 Server Error: bad env POSTGRES_PASSWORD={pw}"
    with pytest.raises(_postgres.PostgresUnavailable) as info:
        pgd.DockerPostgres("postgres:17", "host", container_class=stand_in)
    (made,) = stand_in.made
    assert made.env["POSTGRES_PASSWORD"] not in str(info.value)
    assert "POSTGRES_PASSWORD=***" in str(info.value) and made.stopped
    assert local_pg_image_version("ackkit-test/postgres:17") == "17"
    assert local_pg_image_version("postgres:17") is None


def test_the_version_in_a_root_is_its_newest_server(tmp_path: pathlib.Path) -> None:
    with pytest.raises(BrokerUnavailable, match="holds no PostgreSQL server"):
        postgres_version_in(tmp_path)
    for version in ("9", "17", "15"):
        server = tmp_path / f"usr/lib/postgresql/{version}/bin/postgres"
        server.parent.mkdir(parents=True)
        server.touch()
    (tmp_path / "usr/lib/postgresql/18/bin").mkdir(parents=True)  # no server there
    assert postgres_version_in(tmp_path) == "17"
