"""The broker test kit itself, on a real broker.

Counts must match what the broker holds (publish -> ready, unacked delivery ->
unacked, purge), an own node must survive restart/kill with its durable data,
close_connections must really cut clients off, and no password may leak.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any
from unittest import mock

import pika
import pika.exceptions
import pytest

import ackkit
from ackkit.testing import (
    BrokerError,
    BrokerHandle,
    BrokerNotOwned,
    BrokerUnavailable,
    QueueCounts,
    QueueNotFound,
    mask_url,
    provision_broker,
)
from ackkit.testing import _broker as broker_mod
from ackkit.testing._util import mask_secrets, pid_alive
from ackkit.testing.plugin import QueueFactory
from ackkit_testkit import _own as own_mod
from ackkit_testkit._proc import iter_processes
from ackkit_testkit._provider_node import _OwnNode

pytestmark = pytest.mark.integration

PERSISTENT = pika.BasicProperties(delivery_mode=2)


@contextlib.contextmanager
def channel(broker: BrokerHandle) -> Iterator[Any]:
    conn = broker.connect()
    try:
        yield conn.channel()
    finally:
        with contextlib.suppress(Exception):
            conn.close()


def publish(broker: BrokerHandle, queue: str, n: int = 1, body: bytes = b"m") -> None:
    """Publish n persistent messages with publisher confirms (so they are in the queue)."""
    with channel(broker) as ch:
        ch.confirm_delivery()
        for _ in range(n):
            ch.basic_publish("", queue, body, properties=PERSISTENT, mandatory=True)


# --------------------------------------------------------------------------- masking


def test_mask_url_hides_password() -> None:
    assert (
        mask_url("amqp://guest:guest@127.0.0.1:5672/%2f") == "amqp://guest:***@127.0.0.1:5672/%2f"
    )
    assert mask_url("amqps://u:p%40ss@h.example/v") == "amqps://u:***@h.example/v"
    assert mask_url("amqp://h:5672/%2f") == "amqp://h:5672/%2f"
    assert mask_url("amqp://user@h/") == "amqp://user@h/"
    text = "could not reach amqp://app:s3cr3t@10.0.0.1:5672/prod (timeout)"
    assert mask_secrets(text) == "could not reach amqp://app:***@10.0.0.1:5672/prod (timeout)"


def test_handle_repr_masks_password(rabbitmq: BrokerHandle) -> None:
    assert ":guest@" in rabbitmq.url
    for text in (repr(rabbitmq), str(rabbitmq), rabbitmq.masked_url):
        assert ":***@" in text
        assert ":guest@" not in text


def test_errors_mask_password() -> None:
    with pytest.raises(BrokerUnavailable) as info:
        broker_mod._UrlBroker("amqp://app:s3cr3t@127.0.0.1:1/%2f")
    assert "s3cr3t" not in str(info.value)
    assert "app:***@127.0.0.1:1" in str(info.value)

    remote = broker_mod._UrlBroker("amqp://app:s3cr3t@broker.example.invalid/%2f", check=False)
    with pytest.raises(BrokerError, match="not on this machine") as info2:
        remote.counts("q")
    assert "s3cr3t" not in str(info2.value)
    assert "s3cr3t" not in repr(remote)


# --------------------------------------------------------------------------- counts


def test_counts_reflect_publish(rabbitmq: BrokerHandle, queue_factory: QueueFactory) -> None:
    q = queue_factory(declare=True)
    assert rabbitmq.counts(q) == QueueCounts(ready=0, unacked=0, total=0, consumers=0)
    publish(rabbitmq, q)
    assert rabbitmq.counts(q) == QueueCounts(ready=1, unacked=0, total=1, consumers=0)
    assert rabbitmq.counts_all()[q] == QueueCounts(1, 0, 1, 0)


def test_counts_reflect_unacked_delivery(
    rabbitmq: BrokerHandle, queue_factory: QueueFactory
) -> None:
    q = queue_factory(declare=True)
    publish(rabbitmq, q, 2)
    conn = rabbitmq.connect()
    try:
        ch = conn.channel()
        ch.basic_qos(prefetch_count=1)
        tags: list[int] = []
        ch.basic_consume(q, lambda _ch, method, _p, _b: tags.append(method.delivery_tag))
        deadline = time.monotonic() + 10
        while not tags and time.monotonic() < deadline:
            conn.process_data_events(time_limit=0.05)
        assert tags, "no delivery within 10 s"
        # counts are read right away: the delivery is unacked on the broker already
        assert rabbitmq.counts(q) == QueueCounts(ready=1, unacked=1, total=2, consumers=1)
        ch.basic_ack(tags[0])
        conn.process_data_events(time_limit=0.1)  # flush the ack; the next message arrives
        rabbitmq.wait_for(q, ready=0, unacked=1, total=1, consumers=1)
    finally:
        conn.close()
    # the connection is gone: the unacked message is back to ready
    assert rabbitmq.wait_for(q, ready=1, unacked=0, consumers=0) == QueueCounts(1, 0, 1, 0)


def test_purge(rabbitmq: BrokerHandle, queue_factory: QueueFactory) -> None:
    q = queue_factory(declare=True)
    publish(rabbitmq, q, 3)
    assert rabbitmq.counts(q).ready == 3
    assert rabbitmq.purge(q) == 3
    assert rabbitmq.counts(q) == QueueCounts(0, 0, 0, 0)


def test_missing_queue(rabbitmq: BrokerHandle, fresh_queue: str) -> None:
    with pytest.raises(QueueNotFound):
        rabbitmq.counts(fresh_queue)
    with pytest.raises(QueueNotFound):
        rabbitmq.purge(fresh_queue)
    assert fresh_queue not in rabbitmq.counts_all()
    rabbitmq.delete(fresh_queue)  # deleting what is not there is fine


def test_delete(rabbitmq: BrokerHandle, queue_factory: QueueFactory) -> None:
    q = queue_factory(declare=True)
    publish(rabbitmq, q)
    rabbitmq.delete(q)
    with pytest.raises(QueueNotFound):
        rabbitmq.counts(q)


def test_fast_counts_agree_with_rabbitmqctl(
    rabbitmq: BrokerHandle, queue_factory: QueueFactory
) -> None:
    odd = queue_factory("odd name", declare=True) + ".ünï cödé"
    with channel(rabbitmq) as ch:
        ch.queue_declare(odd, durable=True)
    q = queue_factory(declare=True)
    publish(rabbitmq, q, 4)
    publish(rabbitmq, odd, 2)
    via_ctl = rabbitmq._ctl_counts()
    assert via_ctl[q] == rabbitmq.counts(q) == QueueCounts(4, 0, 4, 0)
    assert via_ctl[odd] == rabbitmq.counts(odd) == QueueCounts(2, 0, 2, 0)
    # (only our queues: an AMQP_URL broker may hold others' queues that change meanwhile)
    fast_all = rabbitmq.counts_all()
    assert fast_all[q] == via_ctl[q] and fast_all[odd] == via_ctl[odd]


def test_fast_topology_agrees_with_rabbitmqctl(
    rabbitmq: BrokerHandle, queue_factory: QueueFactory
) -> None:
    """exchange_types() and bindings(q) read the node through erl_call where the kit owns
    it: the same answers as with that path off (rabbitmqctl), odd names included."""
    q = queue_factory("bound ünï", declare=True)
    ex, hx = f"{q}.tøpic", f"{q}.headers"
    with channel(rabbitmq) as ch:
        ch.exchange_declare(ex, "topic")
        ch.exchange_declare(hx, "headers")
        ch.queue_bind(q, ex, "a.*.ü")
        ch.queue_bind(q, ex, "#")
        ch.queue_bind(q, hx, "", arguments={"x-match": "all", "k": "v"})
    try:
        fast_types, fast_bindings = rabbitmq.exchange_types(), rabbitmq.bindings(q)
        assert fast_types[ex] == "topic" and fast_types[hx] == "headers"
        assert fast_types[""] == "direct" and fast_types["amq.fanout"] == "fanout"
        assert fast_bindings == {("", q), (ex, "a.*.ü"), (ex, "#"), (hx, "")}
        assert rabbitmq.bindings(f"{q}.absent") == set()
        with mock.patch.object(rabbitmq, "_erl_eval", return_value=None):
            via_ctl_types, via_ctl_bindings = rabbitmq.exchange_types(), rabbitmq.bindings(q)
        assert {k: via_ctl_types[k] for k in (ex, hx, "")} == {
            k: fast_types[k] for k in (ex, hx, "")
        }
        assert via_ctl_bindings == fast_bindings
    finally:
        with channel(rabbitmq) as ch:
            ch.exchange_delete(ex)
            ch.exchange_delete(hx)


def test_fast_declared_and_eval_agree_with_rabbitmqctl(
    rabbitmq: BrokerHandle, queue_factory: QueueFactory
) -> None:
    """declared(q) and eval_erlang(expr) ask the node through erl_call where the kit owns
    it: the same answers as with that path off (rabbitmqctl), odd names and every kind
    of argument value included."""
    quorum, classic = queue_factory("qüorum"), queue_factory("clässic")
    with channel(rabbitmq) as ch:
        ch.queue_declare(quorum, durable=True, arguments={
            "x-queue-type": "quorum", "x-delivery-limit": 5,
            "x-dead-letter-exchange": "dlx ü", "x-single-active-consumer": True,
        })  # fmt: skip
        ch.queue_declare(classic, arguments={"x-message-ttl": 400, "x-max-priority": 3})
    fast = {q: rabbitmq.declared(q) for q in (quorum, classic, f"{classic}.absent")}
    assert fast[quorum] is not None and fast[quorum].type == "quorum"
    assert fast[quorum].arguments == {
        "x-queue-type": "quorum", "x-delivery-limit": 5,
        "x-dead-letter-exchange": "dlx ü", "x-single-active-consumer": True,
    }  # fmt: skip
    assert fast[classic] is not None and fast[classic].type == "classic"
    # 4.x names the default queue type among a classic queue's arguments; 3.x does not
    assert {k: v for k, v in fast[classic].arguments.items() if k != "x-queue-type"} == {
        "x-message-ttl": 400, "x-max-priority": 3,
    }  # fmt: skip
    assert fast[classic].arguments.get("x-queue-type", "classic") == "classic"
    assert fast[f"{classic}.absent"] is None
    assert rabbitmq.eval_erlang("lists:sum([1, 2, 3]).") == "6"
    # rabbitmqctl for the queue with every kind of value (each run is a VM: 10-15 s on
    # a busy machine)
    with mock.patch.object(rabbitmq, "_erl_eval", return_value=None):
        assert rabbitmq.declared(quorum) == fast[quorum]
        assert rabbitmq.eval_erlang("lists:sum([1, 2, 3]).") == "6"


def test_wait_for_reports_last_counts(rabbitmq: BrokerHandle, queue_factory: QueueFactory) -> None:
    q = queue_factory(declare=True)
    with pytest.raises(AssertionError, match=r"ready=0, unacked=0, total=0"):
        rabbitmq.wait_for(q, ready=5, timeout=0.3)


def test_messages_and_dead_letters_read_float_headers_as_floats(
    rabbitmq: BrokerHandle, queue_factory: QueueFactory
) -> None:
    """pika reads a float or double header as an int (2.5 as 2): the kit reads the header
    bytes itself. A producer sends doubles (at any depth); the broker dead-letters one
    copy (a reject); both read back as the floats sent, the other values unchanged."""
    dlq = queue_factory("dlq", declare=True)
    q = queue_factory()
    with channel(rabbitmq) as ch:
        ch.queue_declare(
            q,
            durable=True,
            arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq},
        )
    sent = {"one": 1.0, "ratio": 2.5, "nested": {"x": -0.25, "n": 3}, "list": [1.5, 7], "i": 4}
    with ackkit.connect(rabbitmq.url) as conn:
        conn.publish(q, b"a", headers=sent)
        conn.publish(q, b"b", headers=sent)
    with channel(rabbitmq) as ch:
        method, _props, _body = ch.basic_get(q)
        ch.basic_reject(method.delivery_tag, requeue=False)  # the broker dead-letters "a"
    rabbitmq.wait_for(dlq, ready=1)

    def floats(h: dict[str, Any]) -> list[tuple[str, Any, type]]:
        return [
            ("one", h["one"], type(h["one"])),
            ("ratio", h["ratio"], type(h["ratio"])),
            ("nested.x", h["nested"]["x"], type(h["nested"]["x"])),
            ("list[0]", h["list"][0], type(h["list"][0])),
        ]

    want = [("one", 1.0, float), ("ratio", 2.5, float), ("nested.x", -0.25, float)]
    want.append(("list[0]", 1.5, float))
    [left] = rabbitmq.messages(q)
    [dead] = rabbitmq.dead_letters(dlq)
    for m in (left, dead):
        assert floats(m.headers) == want
        assert floats(m.properties.headers) == want
        assert (m.headers["i"], m.headers["nested"]["n"], m.headers["list"][1]) == (4, 3, 7)
        assert type(m.headers["i"]) is int
    assert dead.headers["x-death"][0]["reason"] == "rejected"
    assert dead.body == b"a" and left.body == b"b"


def test_queue_factory_cleans_up_companions(
    rabbitmq: BrokerHandle, request: pytest.FixtureRequest
) -> None:
    factory = QueueFactory(request)
    q = factory(declare=True)
    assert q.startswith("t.test_queue_factory_cleans_up_companions.")
    companions = [f"{q}.dlq", f"{q}.retry.5000", f"{q}.retry.30000"]
    with channel(rabbitmq) as ch:
        for name in companions:
            ch.queue_declare(name, durable=True)
        ch.exchange_declare(f"{q}.retry", "direct", durable=True)
    unrelated = f"{q}x"  # shares the prefix but is not a companion
    with channel(rabbitmq) as ch:
        ch.queue_declare(unrelated)
    try:
        factory.cleanup()
        left = set(rabbitmq.queue_names())
        assert not left & {q, *companions}
        assert unrelated in left
        assert f"{q}.retry" not in rabbitmq.exchange_names()
    finally:
        rabbitmq.delete(unrelated)


# --------------------------------------------------------------------------- own node


def test_own_rabbitmq_is_owned_and_separate(
    own_rabbitmq: BrokerHandle, rabbitmq: BrokerHandle
) -> None:
    assert own_rabbitmq.own
    assert own_rabbitmq.url != rabbitmq.url
    assert own_rabbitmq.node_name
    assert own_rabbitmq.amqp_port == pika.URLParameters(own_rabbitmq.url).port
    assert "ackkit-test" in own_rabbitmq.node_name or own_rabbitmq.kind == "docker"


def test_ctl_runs_against_the_node(own_rabbitmq: BrokerHandle) -> None:
    out = own_rabbitmq.ctl("eval", "node().")
    assert str(own_rabbitmq.node_name) in out


def test_restart_keeps_durable_queue_and_persistent_message(
    own_rabbitmq: BrokerHandle, queue_factory: QueueFactory
) -> None:
    q = queue_factory(declare=True, broker=own_rabbitmq)
    publish(own_rabbitmq, q, body=b"survives")
    own_rabbitmq.restart()
    assert own_rabbitmq.counts(q) == QueueCounts(1, 0, 1, 0)
    with channel(own_rabbitmq) as ch:
        _method, _props, body = ch.basic_get(q, auto_ack=True)
    assert body == b"survives"


@pytest.mark.chaos
def test_kill_then_start_keeps_confirmed_persistent_message(
    own_rabbitmq: BrokerHandle, queue_factory: QueueFactory
) -> None:
    q = queue_factory(declare=True, broker=own_rabbitmq)
    publish(own_rabbitmq, q, 3)
    own_rabbitmq.kill()
    assert not own_rabbitmq.ping(timeout=1)
    own_rabbitmq.start()
    assert own_rabbitmq.counts(q) == QueueCounts(3, 0, 3, 0)


def test_stop_then_next_test_gets_it_running(own_rabbitmq: BrokerHandle) -> None:
    own_rabbitmq.stop()
    assert not own_rabbitmq.ping(timeout=1)


def test_own_rabbitmq_is_running_again(own_rabbitmq: BrokerHandle) -> None:
    assert own_rabbitmq.ping()


def test_close_connections_kills_pika_connection(own_rabbitmq: BrokerHandle) -> None:
    conn = own_rabbitmq.connect()
    try:
        conn.channel()
        own_rabbitmq.close_connections(reason="testkit says bye")
        with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as info:
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                conn.process_data_events(time_limit=0.1)
        assert info.value.reply_code == 320  # CONNECTION_FORCED
        assert "testkit says bye" in info.value.reply_text
    finally:
        with contextlib.suppress(Exception):
            conn.close()
    assert own_rabbitmq.ping()  # new connections are fine


# --------------------------------------------------------------------------- external


def test_external_broker_refuses_node_control(rabbitmq: BrokerHandle) -> None:
    external = broker_mod._UrlBroker(rabbitmq.url)
    assert not external.own
    for op in (external.restart, external.stop, external.start, external.kill):
        with pytest.raises(BrokerNotOwned, match="own_rabbitmq"):
            op()
    external.close()
    assert rabbitmq.ping()


def test_amqp_url_is_used_as_is(monkeypatch: pytest.MonkeyPatch, rabbitmq: BrokerHandle) -> None:
    monkeypatch.setenv("AMQP_URL", rabbitmq.url)
    monkeypatch.delenv("ACKKIT_TEST_BROKER", raising=False)
    with provision_broker() as external:
        assert external.kind == "url"
        assert not external.own
        assert external.url == rabbitmq.url
        assert external.amqp_port == rabbitmq.amqp_port
    assert rabbitmq.ping()  # leaving an external broker's handle stops nothing
    monkeypatch.setenv("ACKKIT_TEST_BROKER", "url")
    with pytest.raises(BrokerUnavailable, match="ACKKIT_TEST_BROKER=url"):
        provision_broker(exclusive=True)


def test_url_mode_counts_against_local_default_node(queue_factory: QueueFactory) -> None:
    """AMQP_URL on this machine: counts through rabbitmqctl against the default node."""
    url = "amqp://guest:guest@127.0.0.1:5672/%2f"
    try:
        external = broker_mod._UrlBroker(url)
    except BrokerUnavailable:
        pytest.skip("no system broker at 127.0.0.1:5672 (optional; the suite never needs it)")
    try:
        external._ctl_path()
    except BrokerError as exc:
        pytest.skip(f"no rabbitmqctl for the system broker: {exc}")
    q = queue_factory(declare=True, broker=external)
    publish(external, q, 2)
    assert external.counts(q) == QueueCounts(2, 0, 2, 0)


def test_url_mode_detects_node_that_is_not_the_url(rabbitmq: BrokerHandle) -> None:
    """A local AMQP_URL on another port than the default node must not report its counts."""
    if rabbitmq.amqp_port == 5672:
        pytest.skip("the session broker is the default node")
    external = broker_mod._UrlBroker(rabbitmq.url)
    with pytest.raises(BrokerError):
        external.counts("anything")


# --------------------------------------------------------------------------- provisioning


def test_unavailable_says_how_to_get_a_broker(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AMQP_URL", raising=False)
    monkeypatch.delenv("ACKKIT_TEST_BROKER", raising=False)
    monkeypatch.setattr(broker_mod, "_docker_engine", lambda: (False, "no engine (test)"))
    monkeypatch.setattr(broker_mod, "_find_rabbitmq_server", lambda: None)
    monkeypatch.setenv("ACKKIT_TEST_RABBITMQ", "3.10")  # the machine's rabbitmq-server path
    with pytest.raises(BrokerUnavailable) as info:
        provision_broker()
    message = str(info.value)
    assert "export AMQP_URL=" in message
    assert "Docker" in message
    assert "apt-get install -y rabbitmq-server" in message
    with pytest.raises(BrokerUnavailable, match="ACKKIT_TEST_BROKER=docker"):
        provision_broker("docker")
    with pytest.raises(ValueError, match="broker mode"):
        provision_broker("bogus")


def _world_readable_dir() -> str:
    path = tempfile.mkdtemp(prefix="ackkit-fake-", dir="/tmp")
    os.chmod(path, 0o755)
    return path


def test_boot_failure_shows_log_tail(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_dir = _world_readable_dir()
    try:
        fake = os.path.join(fake_dir, "rabbitmq-server")
        with open(fake, "w", encoding="ascii") as fh:
            fh.write("#!/bin/sh\necho 'boot exploded: missing thing' >&2\nexit 3\n")
        os.chmod(fake, 0o755)
        monkeypatch.setenv("ACKKIT_RABBITMQ_SERVER", fake)
        monkeypatch.setenv("ACKKIT_TEST_RABBITMQ", "3.10")  # that script is the 3.10 path
        monkeypatch.delenv("AMQP_URL", raising=False)
        with pytest.raises(BrokerUnavailable, match="exited with code 3") as info:
            provision_broker("own")
        assert "boot exploded: missing thing" in str(info.value)
    finally:
        shutil.rmtree(fake_dir, ignore_errors=True)


def test_own_node_leaves_nothing_behind(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AMQP_URL", raising=False)
    broker = provision_broker("own")
    assert isinstance(broker, _OwnNode)
    base = broker._base
    with broker:
        assert broker.ping()
        beams = broker._beam_pids()
        assert beams
    assert broker.closed
    assert not os.path.exists(base)
    assert not any(pid_alive(pid) for pid in beams)
    assert not broker.ping(timeout=1)


def test_reaper_kills_nodes_of_dead_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    # an owner pid that cannot be alive (pids of real processes get reused quickly)
    dead_pid = 4_194_305  # above Linux's largest pid_max (2**22) and macOS's 99999
    parent = _world_readable_dir()
    try:
        base = os.path.join(parent, f"ackkit-node-{dead_pid}-abc")
        os.makedirs(base)
        stray_dir = os.path.join(parent, f"ackkit-node-{dead_pid}-def")
        os.makedirs(stray_dir)
        mine = os.path.join(parent, f"ackkit-node-{os.getpid()}-ghi")
        os.makedirs(mine)
        fake_node = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "import time; time.sleep(60)",
                "-ackkit_owner",
                str(dead_pid),
                "-ackkit_base",
                base,
            ]
        )
        try:
            # Popen can return before the kernel shows the new command line (vfork)
            deadline = time.monotonic() + 10
            while not any(pid == fake_node.pid and base in cmd for pid, cmd in iter_processes()):
                assert time.monotonic() < deadline, "fake node never showed its command line"
                time.sleep(0.01)
            monkeypatch.setattr(own_mod, "_reaped", set())
            own_mod._reap_orphans(parent)
            assert fake_node.wait(10) != 0
        finally:
            if fake_node.poll() is None:
                fake_node.kill()
                fake_node.wait()
        assert not os.path.exists(base)
        assert not os.path.exists(stray_dir)
        assert os.path.exists(mine)  # this run's directories are left alone
    finally:
        shutil.rmtree(parent, ignore_errors=True)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the watchdog uses /proc")
def test_node_halts_when_its_test_process_is_killed(tmp_path: Any) -> None:
    """atexit never runs for a SIGKILLed test run; the node must notice and go away."""
    script = tmp_path / "owner.py"
    script.write_text(
        "import sys, time\n"
        "from ackkit.testing import provision_broker\n"
        "broker = provision_broker('own')\n"
        "print(broker._base, flush=True)\n"
        "time.sleep(120)\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("AMQP_URL", "ACKKIT_TEST_BROKER")}
    owner = subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        assert owner.stdout is not None
        base = owner.stdout.readline().strip()
        assert base, "the owner process did not provision a node"
        tag = f"-ackkit_base {base}"
        beams = [pid for pid, cmd in iter_processes() if tag in cmd]
        assert beams
    finally:
        owner.kill()
        owner.wait()
        if owner.stdout is not None:
            owner.stdout.close()
    deadline = time.monotonic() + 15
    while any(pid_alive(pid) for pid in beams) and time.monotonic() < deadline:
        time.sleep(0.2)
    alive = [pid for pid in beams if pid_alive(pid)]
    for pid in alive:  # do not leave it behind when the assertion fails
        os.kill(pid, 9)
    assert not alive, "the node outlived its SIGKILLed owner by 15 s"
    shutil.rmtree(base, ignore_errors=True)


class _FakeWrapped:
    def __init__(self) -> None:
        self.status = "running"

    def reload(self) -> None:
        pass

    def kill(self) -> None:
        self.status = "exited"

    def start(self) -> None:
        self.status = "running"


def _fake_container_class(port: int, calls: list[list[str]]) -> Any:
    """A stand-in for testcontainers' DockerContainer whose "container" is the
    session broker at ``port``: it records what the provider asked for."""

    class FakeContainer:
        made: list[FakeContainer] = []

        def __init__(self, image: str) -> None:
            self.image = image
            self.name = ""
            self.env: dict[str, str] = {}
            self.kwargs: dict[str, Any] = {}
            self.ports: dict[str, Any] = {}
            self.copied: dict[str, bytes] = {}
            self.stopped = False
            self.wrapped = _FakeWrapped()
            FakeContainer.made.append(self)

        def with_name(self, name: str) -> FakeContainer:
            self.name = name
            return self

        def with_env(self, key: str, value: str) -> FakeContainer:
            self.env[key] = value
            return self

        def with_exposed_ports(self, *ports: int) -> FakeContainer:
            for p in ports:
                self.ports[str(p)] = None
            return self

        def with_kwargs(self, **kwargs: Any) -> FakeContainer:
            self.kwargs = kwargs
            return self

        def with_copy_into_container(self, data: bytes, path: str) -> FakeContainer:
            self.copied[path] = data
            return self

        def start(self) -> FakeContainer:
            return self

        def stop(self) -> None:
            self.stopped = True

        def get_wrapped_container(self) -> _FakeWrapped:
            return self.wrapped

        def get_container_host_ip(self) -> str:
            return "127.0.0.1"

        def get_exposed_port(self, p: int) -> int:
            assert p == 5672
            return port

        def get_logs(self) -> tuple[bytes, bytes]:
            return b"out\n", b""

        def exec(self, command: list[str]) -> tuple[int, bytes]:
            calls.append(command)
            if command[0] == "sh":
                return 127, b""  # no erl_call in this "image"
            return (0, b"ok\n") if command[-1] != "boom" else (70, b"Error: boom\n")

    return FakeContainer


def test_docker_path_glue_remote_engine(
    monkeypatch: pytest.MonkeyPatch, rabbitmq: BrokerHandle
) -> None:
    """The Docker branch on a bridge network of a remote engine, without an engine:
    a stand-in container forwards to the session broker. Checks the URL from the
    mapped port, the conf file, ctl via exec and close."""
    calls: list[list[str]] = []
    fake = _fake_container_class(rabbitmq.amqp_port, calls)
    monkeypatch.delenv("AMQP_URL", raising=False)
    monkeypatch.setenv("DOCKER_HOST", "tcp://docker.example.invalid:2375")
    monkeypatch.setattr(broker_mod, "_docker_engine", lambda: (True, ""))
    monkeypatch.setattr(broker_mod, "_rabbitmq_container_class", lambda: fake)
    monkeypatch.setattr(broker_mod, "_docker_settings", lambda _v: ("rabbitmq:test", "bridge"))
    with provision_broker() as broker:
        assert broker.kind == "docker" and broker.own
        assert broker.url == f"amqp://guest:guest@127.0.0.1:{rabbitmq.amqp_port}/%2F"
        assert broker.amqp_port == rabbitmq.amqp_port
        (container,) = fake.made
        assert container.image == "rabbitmq:test"
        assert container.name.startswith("ackkit-test-")
        assert container.ports == {"5672": None}  # published wherever the engine says
        assert "network_mode" not in container.kwargs
        conf = container.copied["/etc/rabbitmq/conf.d/99-ackkit.conf"].decode()
        assert "listeners.tcp.default = 5672\n" in conf
        assert "loopback_users.guest = false\n" in conf  # logins arrive from the bridge
        assert container.env["RABBITMQ_NODENAME"] == broker.node_name
        assert "ERL_EPMD_PORT" not in container.env
        assert broker.ctl("list_queues") == "ok\n"
        assert calls[-1][-2:] == ["rabbitmqctl", "list_queues"]
        with pytest.raises(BrokerError, match="boom"):
            broker.ctl("boom")
        broker.start()  # AMQP answers: nothing to do
        assert calls[-1][-1] == "boom"
        assert broker.log_text() == "out\n"
    assert container.stopped
    assert rabbitmq.ping()


def test_docker_path_glue_local_bridge(
    monkeypatch: pytest.MonkeyPatch, rabbitmq: BrokerHandle
) -> None:
    """A local engine with a bridge: the AMQP port is published on 127.0.0.1 only,
    on a port picked here (so it stays the same when the container restarts)."""
    from ackkit.testing import _provider_docker

    fake = _fake_container_class(-1, [])
    monkeypatch.delenv("AMQP_URL", raising=False)
    monkeypatch.delenv("DOCKER_HOST", raising=False)
    monkeypatch.setattr(_provider_docker, "free_port", lambda **_: rabbitmq.amqp_port)
    with broker_mod._DockerBroker(fake, image="rabbitmq:test", network="bridge") as broker:
        (container,) = fake.made
        assert container.ports == {"5672/tcp": ("127.0.0.1", rabbitmq.amqp_port)}
        assert broker.url == f"amqp://guest:guest@127.0.0.1:{rabbitmq.amqp_port}/%2F"
        broker.kill(flush_metadata=False)
        assert container.wrapped.status == "exited"
        broker.start()
        assert container.wrapped.status == "running"
        assert broker.url == f"amqp://guest:guest@127.0.0.1:{rabbitmq.amqp_port}/%2F"
    with pytest.raises(ValueError, match="network"):
        broker_mod._DockerBroker(fake, image="rabbitmq:test", network="overlay")
