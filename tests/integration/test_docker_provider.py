"""The test kit's Docker way against a real Docker engine.

Skipped (with the reason) where no engine answers, except in the Docker leg
(``ACKKIT_TEST_BROKER=docker``), where a missing engine is a failure. Counts
are read from the broker inside the container; on an engine without a bridge
network the container must listen on this machine's loopback address only.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import time
from collections.abc import Iterator
from typing import Any

import pika
import pika.exceptions
import pytest

import ackkit_testkit
from ackkit.testing import (
    BrokerError,
    BrokerHandle,
    QueueCounts,
    _docker_engine,
    provision_broker,
)
from ackkit.testing import _broker as broker_mod
from ackkit.testing._env import wanted_version
from ackkit.testing.plugin import QueueFactory
from ackkit_testkit import _docker_image

pytestmark = pytest.mark.integration

PERSISTENT = pika.BasicProperties(delivery_mode=2)
DEAD_PID = 4_194_305  # above Linux's largest pid_max: never a live process


def _engine_or_skip() -> None:
    ok, why = broker_mod._docker_engine()
    if ok:
        return
    if os.environ.get("ACKKIT_TEST_BROKER", "").strip().lower() == "docker":
        pytest.fail(f"ACKKIT_TEST_BROKER=docker but {why}")
    pytest.skip(f"no Docker engine: {why}")


@pytest.fixture(scope="module")
def client() -> Iterator[Any]:
    _engine_or_skip()
    c = _docker_engine.docker_client()
    yield c
    c.close()


@pytest.fixture(scope="module")
def container_broker(client: Any) -> Iterator[BrokerHandle]:
    with provision_broker("docker", exclusive=True) as broker:
        yield broker


@pytest.fixture
def docker_broker(container_broker: BrokerHandle) -> BrokerHandle:
    container_broker.start()  # running again after a test that stopped or killed it
    return container_broker


def _container(client: Any, broker: BrokerHandle) -> Any:
    return client.containers.get(broker._name)  # type: ignore[attr-defined]


def publish(broker: BrokerHandle, queue: str, n: int) -> None:
    conn = broker.connect()
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        for i in range(n):
            ch.basic_publish("", queue, b"m%d" % i, properties=PERSISTENT, mandatory=True)
    finally:
        conn.close()


def _listeners(ports: set[int]) -> dict[int, set[str]]:
    """Addresses (hex, as in /proc/net/tcp*) listening on ``ports`` in this network."""
    found: dict[int, set[str]] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table, encoding="ascii") as fh:
            for line in fh.readlines()[1:]:
                fields = line.split()
                addr, port_hex = fields[1].split(":")
                if fields[3] == "0A" and int(port_hex, 16) in ports:  # LISTEN
                    found.setdefault(int(port_hex, 16), set()).add(addr)
    return found


# --------------------------------------------------------------------------- start


def test_start_gives_an_owned_node_on_loopback(client: Any, docker_broker: BrokerHandle) -> None:
    b: Any = docker_broker
    assert b.kind == "docker" and b.own
    assert b.url.startswith("amqp://guest:guest@127.0.0.1:")
    assert b.amqp_port == pika.URLParameters(b.url).port
    assert b.ping()
    info = _container(client, b).attrs
    assert info["State"]["Running"]
    if not os.environ.get("ACKKIT_TEST_RABBITMQ_IMAGE"):  # the version asked for runs
        version = _docker_engine.docker_version(wanted_version())
        assert b.image.endswith(f":{version}")
        running = b.ctl("eval", "rabbit_misc:version().")
        assert running.strip().strip('"').startswith(version + "."), running
    if b.network == "host":
        assert info["HostConfig"]["NetworkMode"] == "host"
        ports = {b.amqp_port, b._dist_port, b._epmd_port}
        assert len(ports) == 3 and not ports & {5672, 25672, 4369, 5673, 25673, 4370}
        listening = _listeners(ports)
        assert set(listening) == ports, f"not all of AMQP/dist/epmd listen: {listening}"
        loopback = {"0100007F", "00000000000000000000000001000000"}  # 127.0.0.1, ::1
        assert all(addrs <= loopback for addrs in listening.values()), listening
    else:
        bound = info["HostConfig"]["PortBindings"]["5672/tcp"][0]
        assert bound["HostIp"] == "127.0.0.1"
        assert int(bound["HostPort"]) == b.amqp_port


# --------------------------------------------------------------------------- counts / ctl


def test_counts_follow_publish_and_delivery(
    docker_broker: BrokerHandle, queue_factory: QueueFactory
) -> None:
    q = queue_factory(declare=True, broker=docker_broker)
    assert docker_broker.counts(q) == QueueCounts(0, 0, 0, 0)
    publish(docker_broker, q, 3)
    assert docker_broker.counts(q) == QueueCounts(3, 0, 3, 0)
    conn = docker_broker.connect()
    try:
        ch = conn.channel()
        ch.basic_qos(prefetch_count=1)
        got: list[int] = []
        ch.basic_consume(q, lambda _c, m, _p, _b: got.append(m.delivery_tag))
        deadline = time.monotonic() + 10
        while not got and time.monotonic() < deadline:
            conn.process_data_events(time_limit=0.05)
        assert got
        docker_broker.wait_for(q, ready=2, unacked=1, total=3, consumers=1)
        ch.basic_ack(got[0])
        conn.process_data_events(time_limit=0.1)
        docker_broker.wait_for(q, ready=1, unacked=1, total=2, consumers=1)
    finally:
        conn.close()
    docker_broker.wait_for(q, ready=2, unacked=0, total=2, consumers=0)


def test_fast_counts_agree_with_rabbitmqctl(
    docker_broker: BrokerHandle, queue_factory: QueueFactory
) -> None:
    q = queue_factory(declare=True, broker=docker_broker)
    publish(docker_broker, q, 4)
    fast = docker_broker.counts(q)
    assert docker_broker._erl_call_ok is True  # type: ignore[attr-defined]
    assert docker_broker._ctl_counts()[q] == fast == QueueCounts(4, 0, 4, 0)


def test_ctl_runs_in_the_container(docker_broker: BrokerHandle) -> None:
    assert str(docker_broker.node_name) in docker_broker.ctl("eval", "node().")
    with pytest.raises(BrokerError, match="exit code"):
        docker_broker.ctl("no_such_command")


# --------------------------------------------------------------------------- faults


def test_restart_keeps_durable_data_and_cuts_clients(
    docker_broker: BrokerHandle, queue_factory: QueueFactory
) -> None:
    q = queue_factory(declare=True, broker=docker_broker)
    publish(docker_broker, q, 2)
    conn = docker_broker.connect()
    url = docker_broker.url
    try:
        docker_broker.restart()
        with pytest.raises(pika.exceptions.AMQPConnectionError):
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                conn.process_data_events(time_limit=0.1)
    finally:
        with contextlib.suppress(Exception):
            conn.close()
    assert docker_broker.url == url
    assert docker_broker.counts(q) == QueueCounts(2, 0, 2, 0)


def test_stop_then_start(docker_broker: BrokerHandle) -> None:
    docker_broker.stop()
    assert not docker_broker.ping(timeout=1)
    docker_broker.start()
    assert docker_broker.ping()


@pytest.mark.chaos
def test_kill_then_start_keeps_confirmed_messages(
    client: Any, docker_broker: BrokerHandle, queue_factory: QueueFactory
) -> None:
    q = queue_factory(declare=True, broker=docker_broker)
    publish(docker_broker, q, 5)
    url = docker_broker.url
    docker_broker.kill()
    assert not docker_broker.ping(timeout=1)
    assert _container(client, docker_broker).status == "exited"
    docker_broker.start()
    assert docker_broker.url == url  # same ports: clients reconnect to the same URL
    assert docker_broker.counts(q) == QueueCounts(5, 0, 5, 0)


def test_close_removes_the_container(client: Any) -> None:
    import docker.errors

    broker: Any = provision_broker("docker", exclusive=True)
    name, port = broker._name, broker.amqp_port
    with broker:
        assert broker.ping()
    assert broker.closed
    with pytest.raises(docker.errors.NotFound):
        client.containers.get(name)
    assert not _listeners({port}) or broker.network != "host"


# --------------------------------------------------------------------------- engine helpers


def test_reaper_removes_only_dead_runs_containers(client: Any) -> None:
    image = _docker_engine.choose_image(client, "host")
    tag = _docker_engine._host_tag()
    names = {
        "dead": f"ackkit-test-{tag}-{DEAD_PID}-aa0001",
        "mine": f"ackkit-test-{tag}-{os.getpid()}-aa0002",
        "other_host": f"ackkit-test-00000000-{DEAD_PID}-aa0003",
    }
    for name in names.values():  # created, never started
        client.containers.create(image, name=name, network_mode="none", command=["true"])
    try:
        removed = _docker_engine.reap_dead_containers(client)
        assert names["dead"] in removed
        left = {c.name for c in client.containers.list(all=True, filters={"name": "ackkit-test-"})}
        assert names["dead"] not in left
        assert {names["mine"], names["other_host"]} <= left
    finally:
        for name in names.values():
            with contextlib.suppress(Exception):
                client.containers.get(name).remove(force=True)


def _fake_root(tmp_path: pathlib.Path, version: str) -> pathlib.Path:
    root = tmp_path / "root"
    for path, text in {
        f"usr/lib/rabbitmq/lib/rabbitmq_server-{version}/ebin/rabbit.app": "app",
        "etc/hosts": "127.0.0.1 localhost\n",
        "var/lib/rabbitmq/.erlang.cookie": "SECRET",
        "var/lib/rabbitmq/mnesia/rabbit@x/data": "old node",
        "var/log/rabbitmq/rabbit.log": "old log",
        "proc/1/status": "not a real proc",
    }.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    return root


def test_image_built_from_a_root_leaves_out_node_state(client: Any, tmp_path: pathlib.Path) -> None:
    import docker.errors

    name = f"ackkit-test/rabbitmq-selftest:{os.getpid()}"
    root = _fake_root(tmp_path, "4.3.6")
    try:
        assert _docker_image.build_image(client, root, name=name) > 0
        image = client.images.get(name)
        assert image.labels["org.ackkit.rabbitmq-version"] == "4.3.6"
        assert "HOME=/var/lib/rabbitmq" in image.attrs["Config"]["Env"]
        assert image.attrs["Config"]["Cmd"] == ["rabbitmq-server"]
        box = client.containers.create(name, network_mode="none")
        try:
            box.get_archive("/etc/hosts")
            box.get_archive("/usr/lib/rabbitmq/lib/rabbitmq_server-4.3.6/ebin/rabbit.app")
            for gone in (
                "/var/lib/rabbitmq/.erlang.cookie",
                "/var/lib/rabbitmq/mnesia",
                "/var/log/rabbitmq/rabbit.log",
                "/proc/1/status",
            ):
                with pytest.raises(docker.errors.NotFound):
                    box.get_archive(gone)
        finally:
            box.remove(force=True)
    finally:
        with contextlib.suppress(Exception):
            client.images.remove(name, force=True)


def test_image_version_must_match_the_root(tmp_path: pathlib.Path) -> None:
    root = _fake_root(tmp_path, "4.0.5")
    with pytest.raises(broker_mod.BrokerUnavailable, match=r"RabbitMQ 4\.0\.5, not 4\.3"):
        _docker_image.build_image(None, root, name="ackkit-test/rabbitmq:4.3")
    assert _docker_engine.local_image_version("ackkit-test/rabbitmq:4.3") == "4.3"
    assert _docker_engine.local_image_version("rabbitmq:4.3") is None


class _Engine:
    """Just enough of a docker client for the choices made before a container starts."""

    def __init__(self, networks: list[str], images: set[str]) -> None:
        self.networks = self
        self._names = networks
        self.images = self
        self._images = images

    def list(self) -> list[Any]:
        return [type("Net", (), {"name": n})() for n in self._names]

    def get(self, name: str) -> str:
        import docker.errors

        if name not in self._images:
            raise docker.errors.ImageNotFound(name)
        return name


def test_network_mode_follows_the_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ACKKIT_TEST_DOCKER_NETWORK", raising=False)
    assert _docker_engine.network_mode(_Engine(["host", "none"], set())) == "host"
    assert _docker_engine.network_mode(_Engine(["bridge", "host", "none"], set())) == "bridge"
    monkeypatch.setenv("ACKKIT_TEST_DOCKER_NETWORK", "host")
    assert _docker_engine.network_mode(_Engine(["bridge", "host", "none"], set())) == "host"
    monkeypatch.setenv("ACKKIT_TEST_DOCKER_NETWORK", "overlay")
    with pytest.raises(ValueError, match="ACKKIT_TEST_DOCKER_NETWORK"):
        _docker_engine.network_mode(_Engine([], set()))


def test_image_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[str] = []

    def fake_ensure(_client: Any, version: str = "4.3") -> str:
        built.append(version)
        return f"ackkit-test/rabbitmq:{version}"

    monkeypatch.setattr(ackkit_testkit, "ensure_local_image", fake_ensure)
    monkeypatch.delenv("ACKKIT_TEST_RABBITMQ_IMAGE", raising=False)
    bare, with_local = _Engine([], set()), _Engine([], {"ackkit-test/rabbitmq:4.3"})
    assert _docker_engine.choose_image(bare, "bridge") == "rabbitmq:4.3"  # official, pulled
    assert built == []
    assert _docker_engine.choose_image(bare, "host") == "ackkit-test/rabbitmq:4.3"
    assert _docker_engine.choose_image(with_local, "bridge") == "ackkit-test/rabbitmq:4.3"
    monkeypatch.setenv("ACKKIT_TEST_RABBITMQ_IMAGE", "rabbitmq:4.1-management")
    assert _docker_engine.choose_image(with_local, "host") == "rabbitmq:4.1-management"
    monkeypatch.setenv("ACKKIT_TEST_RABBITMQ_IMAGE", "ackkit-test/rabbitmq:4.0")
    assert _docker_engine.choose_image(bare, "bridge") == "ackkit-test/rabbitmq:4.0"
    assert built == ["4.3", "4.3", "4.0"]
    monkeypatch.delenv("ACKKIT_TEST_RABBITMQ_IMAGE")
    assert _docker_engine.choose_image(bare, "bridge", "4.0") == "rabbitmq:4.0"
    assert _docker_engine.docker_version("3.10") == "4.3"  # the kit's default: 4.3 in Docker
    assert _docker_engine.docker_version("4.0") == "4.0"


def test_the_docker_leg_runs_on_containers(rabbitmq: BrokerHandle) -> None:
    """ACKKIT_TEST_BROKER=docker must give every fixture a container, not a fallback."""
    if os.environ.get("ACKKIT_TEST_BROKER", "").strip().lower() != "docker":
        pytest.skip("not the Docker leg (ACKKIT_TEST_BROKER is not docker)")
    assert rabbitmq.kind == "docker" and rabbitmq.own


def test_image_cli_for_tests(
    client: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """What `make test-docker` runs first: nothing to build for another image; exit 3
    (skip) when the kit's image is missing and no Debian root can be made."""
    monkeypatch.setenv("ACKKIT_TEST_RABBITMQ_IMAGE", "rabbitmq:4.1")
    assert _docker_image.main(["--for-tests"]) == 0
    assert "runs rabbitmq:4.1" in capsys.readouterr().out

    def no_root(version: str) -> pathlib.Path:
        raise _docker_image.NoRootBuilder(f"no root for {version} (test)")

    monkeypatch.setattr(_docker_image, "_ensure_root", no_root)
    monkeypatch.setenv("ACKKIT_TEST_RABBITMQ_IMAGE", "ackkit-test/rabbitmq:0.0-missing")
    assert _docker_image.main(["--for-tests"]) == 3
    assert "no root for 0.0-missing" in capsys.readouterr().err
