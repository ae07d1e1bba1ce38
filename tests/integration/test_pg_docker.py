"""The test kit's PostgreSQL container against a real Docker engine.

Skipped (with the reason) where no engine answers, except in the Docker leg
(``ACKKIT_TEST_POSTGRES=docker``), where a missing engine is a failure. What the
server and the engine say is asserted: the listen address and version the server
reports, rows written before a stop, the containers the engine lists.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from ackkit.testing import _docker_engine
from ackkit_testkit import _provider_pg_docker as pgd
from ackkit_testkit._pg_image import local_pg_image_version

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def client() -> Iterator[Any]:
    ok, why = _docker_engine._docker_engine()
    if not ok:
        if os.environ.get("ACKKIT_TEST_POSTGRES", "").strip().lower() == "docker":
            pytest.fail(f"ACKKIT_TEST_POSTGRES=docker but {why}")
        pytest.skip(f"no Docker engine: {why}")
    c = _docker_engine.docker_client()
    yield c
    c.close()


@pytest.fixture(scope="module")
def pg(client: Any) -> Iterator[pgd.DockerPostgres]:
    h = pgd.provision_docker_postgres()
    yield h
    h.close()


def _one(dsn: str, query: str) -> Any:
    with psycopg.connect(dsn, connect_timeout=5) as conn:
        row = conn.execute(query).fetchone()
    assert row is not None
    return row[0]


def _containers(client: Any, name: str) -> list[Any]:
    return [c for c in client.containers.list(all=True) if c.name == name]


def test_the_container_listens_on_loopback_with_its_own_password(
    client: Any, pg: pgd.DockerPostgres
) -> None:
    (container,) = _containers(client, pg._name)
    assert container.status == "running"
    if pg.network == "host":
        assert container.attrs["HostConfig"]["NetworkMode"] == "host"
        assert _one(pg.dsn, "SHOW listen_addresses") == "127.0.0.1"
    if local_pg_image_version(pg.image):
        assert _one(pg.dsn, "SHOW server_version_num").startswith("17")
    assert pg._password not in repr(pg)
    wrong = pg.dsn.replace(pg._password, "not-the-password")
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        psycopg.connect(wrong, connect_timeout=5).close()


def test_stop_and_start_keep_the_data(pg: pgd.DockerPostgres) -> None:
    with psycopg.connect(pg.dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE kept (n int)")
        conn.execute("INSERT INTO kept VALUES (1), (2)")
    for mode in ("fast", "immediate"):
        pg.stop(mode)
        with pytest.raises(psycopg.OperationalError):
            psycopg.connect(pg.dsn, connect_timeout=2).close()
        pg.start()
        assert _one(pg.dsn, "SELECT sum(n) FROM kept") == 3


def test_the_kits_image_holds_no_cluster_of_its_own(client: Any, pg: pgd.DockerPostgres) -> None:
    if not local_pg_image_version(pg.image):
        pytest.skip(f"{pg.image} is not the kit's image")
    out = client.containers.run(
        pg.image,
        [
            "sh",
            "-c",
            "find /var/lib/postgresql /etc/postgresql /etc/ssl/private -mindepth 1; id -un",
        ],
        network_mode="host",
        remove=True,
    )
    # nothing of the cluster the package made while installing, nor ssl-cert's key;
    # the image runs as the postgres user
    assert out.decode().split() == ["postgres"]


def test_close_removes_the_container(client: Any) -> None:
    h = pgd.provision_docker_postgres()
    name = h._name
    assert _containers(client, name)
    h.close()
    assert _containers(client, name) == []
    with pytest.raises(RuntimeError, match="closed"):
        h.stop()


def test_the_postgres_fixture_is_a_container_in_the_docker_leg(postgres: Any) -> None:
    if os.environ.get("ACKKIT_TEST_POSTGRES", "").strip().lower() != "docker":
        pytest.skip("ACKKIT_TEST_POSTGRES is not docker")
    assert isinstance(postgres, pgd.DockerPostgres) and postgres.own
