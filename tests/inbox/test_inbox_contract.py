"""The inbox's contract, run on both stores: the PostgreSQL inbox on a real RabbitMQ,
and the in-memory inbox (``Inbox("memory://...")``) on the test kit's in-memory broker,
which is what a service's fast tests use. Same behaviours, same assertions, on App and
AsyncApp; what the broker shows (queue counts, dead letters) and which handler calls
returned (their effects)."""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from ackkit import Retry, RetryStrategy
from ackkit.inbox import Inbox, MissingKey, memory_inbox

from ._harness import Behaviour, build, effects, effects_table, eventually, inbox_keys, running


@dataclass
class Setup:
    broker: Any
    dsn: str
    pg: bool

    def inbox(self, **kw: Any) -> Inbox:
        return Inbox(self.dsn, **kw)


@pytest.fixture(params=["memory", "postgres"])
def setup(request: pytest.FixtureRequest) -> Iterator[Setup]:
    if request.param == "memory":
        broker = request.getfixturevalue("memory_broker")
        name = f"memory://contract-{secrets.token_hex(4)}"
        yield Setup(broker, name, pg=False)
        memory_inbox(name).clear()
        return
    request.applymarker(pytest.mark.integration)
    broker = request.getfixturevalue("rabbitmq")
    dsn = request.getfixturevalue("postgres_dsn")
    effects_table(dsn)
    yield Setup(broker, dsn, pg=True)


@pytest.fixture
def queue(setup: Setup, queue_factory: Any) -> str:
    return str(queue_factory("inbox", broker=setup.broker))


pytestmark = pytest.mark.one_leg  # the database is the subject, not the broker

KINDS = ["sync", "async"]


@pytest.mark.parametrize("kind", KINDS)
def test_a_redelivered_key_is_acked_without_running(kind: str, setup: Setup, queue: str) -> None:
    b = Behaviour()
    app = build(kind, setup.broker.url, queue, setup.inbox(), b, name="c")
    with running(kind, app):
        for mid in ["a", "b", "a", "a", "b"]:
            setup.broker.publish(queue, b"x", message_id=mid)
        setup.broker.wait_for(queue, ready=0, unacked=0, timeout=20)
        eventually(lambda: app.stats()["c"]["acked"] == 5)
        assert app.stats()["c"]["duplicate"] == 3
    assert sorted(b.succeeded) == ["a", "b"]
    if setup.pg:
        assert sorted(effects(setup.dsn)) == ["a", "b"]


@pytest.mark.parametrize("kind", KINDS)
def test_keys_are_per_listener(kind: str, setup: Setup, queue: str, queue_factory: Any) -> None:
    """The same message on two listeners' queues runs once in each."""
    q2 = queue_factory("second", broker=setup.broker)
    b1, b2 = Behaviour(), Behaviour()
    a1 = build(kind, setup.broker.url, queue, setup.inbox(), b1, name="one")
    a2 = build(kind, setup.broker.url, q2, setup.inbox(), b2, name="two")
    with running(kind, a1), running(kind, a2):
        for q in (queue, q2, queue, q2):
            setup.broker.publish(q, b"x", message_id="same")
        for q in (queue, q2):
            setup.broker.wait_for(q, ready=0, unacked=0, timeout=20)
        eventually(lambda: a1.stats()["one"]["acked"] == 2 and a2.stats()["two"]["acked"] == 2)
    assert b1.succeeded == ["same"] and b2.succeeded == ["same"]


@pytest.mark.parametrize("kind", KINDS)
def test_a_failed_call_records_no_key(kind: str, setup: Setup, queue: str) -> None:
    b = Behaviour(fail_times=1)
    app = build(kind, setup.broker.url, queue, setup.inbox(), b, name="c")
    with running(kind, app):
        setup.broker.publish(queue, b"x", message_id="k")
        setup.broker.wait_for(queue, ready=0, unacked=0, timeout=20)
        eventually(lambda: app.stats()["c"]["acked"] == 1)
    assert b.calls == 2 and b.succeeded == ["k"]
    if setup.pg:
        assert effects(setup.dsn) == ["k"]


@pytest.mark.parametrize("kind", KINDS)
def test_broker_retry_of_a_failure_runs_again_and_dlq_after_the_last(
    kind: str, setup: Setup, queue: str
) -> None:
    b = Behaviour(always_fail=True)
    retry = Retry(max_attempts=2, initial_interval=0.1, strategy=RetryStrategy.BROKER)
    app = build(kind, setup.broker.url, queue, setup.inbox(), b, name="c", retry=retry)
    with running(kind, app):
        setup.broker.publish(queue, b"x", message_id="k")
        setup.broker.wait_for(f"{queue}.dlq", ready=1, timeout=20)
    assert b.calls == 2 and b.succeeded == []
    if setup.pg:
        assert effects(setup.dsn) == []


@pytest.mark.parametrize("kind", KINDS)
def test_no_key_is_dead_lettered_with_its_reason(kind: str, setup: Setup, queue: str) -> None:
    b = Behaviour()
    app = build(kind, setup.broker.url, queue, setup.inbox(), b, name="c")
    with running(kind, app):
        setup.broker.publish(queue, b"x", message_id=None)
        setup.broker.wait_for(f"{queue}.dlq", ready=1, timeout=20)
    assert b.calls == 0
    assert "no inbox key" in (setup.broker.dead_letters(f"{queue}.dlq")[0].reason or "")


@pytest.mark.parametrize("kind", KINDS)
def test_a_key_function_reads_a_header(kind: str, setup: Setup, queue: str) -> None:
    inbox = setup.inbox(key=lambda d: (d.headers or {}).get("order-id"))
    b = Behaviour()
    app = build(kind, setup.broker.url, queue, inbox, b, name="c")
    with running(kind, app):
        for i, oid in enumerate(["o1", "o2", "o1"]):
            setup.broker.publish(queue, b"x", message_id=f"m{i}", headers={"order-id": oid})
        setup.broker.wait_for(queue, ready=0, unacked=0, timeout=20)
        eventually(lambda: app.stats()["c"]["acked"] == 3)
    assert b.succeeded == ["m0", "m1"]


@pytest.mark.parametrize("kind", KINDS)
def test_missing_key_run_option_runs_unguarded(kind: str, setup: Setup, queue: str) -> None:
    b = Behaviour()
    app = build(kind, setup.broker.url, queue, setup.inbox(missing_key=MissingKey.RUN), b, name="c")
    with running(kind, app):
        setup.broker.publish(queue, b"one", message_id=None)
        setup.broker.publish(queue, b"one", message_id=None)
        setup.broker.wait_for(queue, ready=0, unacked=0, timeout=20)
        eventually(lambda: app.stats()["c"]["acked"] == 2)
    assert b.succeeded == ["one", "one"]  # no key, no dedup: the documented cost


@pytest.mark.parametrize("kind", ["sync"])
def test_retention_forgets_old_keys(kind: str, setup: Setup, queue: str) -> None:
    inbox = setup.inbox(retention=0.5, retention_interval=0.2, retention_batch=2)
    b = Behaviour()
    app = build(kind, setup.broker.url, queue, inbox, b, name="c")
    with running(kind, app):
        for i in range(5):
            setup.broker.publish(queue, b"x", message_id=f"r{i}")
        eventually(lambda: len(b.succeeded) == 5)
        time.sleep(1.5)  # past the window: the keys are deleted, two at a time
        setup.broker.publish(queue, b"x", message_id="r0")
        eventually(lambda: len(b.succeeded) == 6, what="r0 runs again after retention")
    assert b.succeeded.count("r0") == 2


@pytest.mark.parametrize("kind", KINDS)
def test_twins_in_flight_at_once_run_once(kind: str, setup: Setup, queue: str) -> None:
    """Two deliveries of one message handled at the same time (concurrency 2): the
    second claim waits for the first's commit and is acked as a duplicate."""
    b = Behaviour(sleep=0.3)
    app = build(kind, setup.broker.url, queue, setup.inbox(), b, name="c", concurrency=2)
    with running(kind, app):
        for i in range(3):
            setup.broker.publish_many(queue, [b"x", b"x"], message_id=f"tw{i}")
        setup.broker.wait_for(queue, ready=0, unacked=0, timeout=30)
        eventually(lambda: app.stats()["c"]["acked"] == 6)
        assert app.stats()["c"]["duplicate"] == 3
    assert sorted(b.succeeded) == ["tw0", "tw1", "tw2"]
    if setup.pg:
        assert sorted(effects(setup.dsn)) == ["tw0", "tw1", "tw2"]


@pytest.mark.parametrize("kind", KINDS)
def test_distinct_byte_keys_never_collide(kind: str, setup: Setup, queue: str) -> None:
    """Keys given as bytes that are not UTF-8 are kept whole: b"\\xff-x" and b"\\xfe-x"
    (once both decoded to "\\ufffd-x", and the second acked as a duplicate unrun) are two
    messages. The header goes over the wire as a byte-array, which aio-pika hands over as
    a bytearray and pika as bytes; the same bytes as text are the same key."""
    inbox = setup.inbox(key=lambda d: (d.headers or {}).get("k"))
    b = Behaviour()
    app = build(kind, setup.broker.url, queue, inbox, b, name="c")
    with running(kind, app):
        sent: list[tuple[str, object]] = [
            ("m1", b"\xff-x"),  # a long string ('S') on the wire
            ("m2", b"\xfe-x"),
            ("m3", b"\xff-x"),  # a duplicate of m1
            ("m4", bytearray(b"\xfd-x")),  # a byte-array ('x') on the wire
            ("m5", bytearray(b"\xff-x")),  # the same bytes as m1: a duplicate
            ("m6", b"ok"),
            ("m7", "ok"),  # the same key as text: a duplicate of m6
        ]
        for mid, key in sent:
            setup.broker.publish(queue, b"x", message_id=mid, headers={"k": key})
        setup.broker.wait_for(queue, ready=0, unacked=0, timeout=20)
        eventually(lambda: app.stats()["c"]["acked"] == 7)
        assert app.stats()["c"]["duplicate"] == 3
    assert setup.broker.counts(f"{queue}.dlq").total == 0
    assert sorted(b.succeeded) == ["m1", "m2", "m4", "m6"]
    if setup.pg:
        assert sorted(effects(setup.dsn)) == ["m1", "m2", "m4", "m6"]
        keys = sorted(k for _, k in inbox_keys(setup.dsn))
        mark = "\ufffe"
        assert keys == ["ok", *sorted(mark + k.hex() for k in (b"\xfd-x", b"\xfe-x", b"\xff-x"))]


@pytest.mark.parametrize("kind", KINDS)
def test_a_key_with_a_nul_character_is_refused_at_once(kind: str, setup: Setup, queue: str) -> None:
    """PostgreSQL text cannot hold NUL: such a key is dead-lettered unrun with its reason,
    not inserted, refused by the server, retried and dead-lettered as "attempts
    exhausted"."""
    inbox = setup.inbox(key=lambda d: (d.headers or {}).get("k"))
    b = Behaviour()
    app = build(kind, setup.broker.url, queue, inbox, b, name="c")
    with running(kind, app):
        setup.broker.publish(queue, b"x", message_id="m1", headers={"k": "a\x00b"})
        setup.broker.wait_for(f"{queue}.dlq", ready=1, timeout=20)
    assert b.calls == 0
    dead = setup.broker.dead_letters(f"{queue}.dlq")[0]
    assert "NUL character" in (dead.reason or "")
