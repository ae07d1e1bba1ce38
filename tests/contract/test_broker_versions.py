"""What differs per RabbitMQ version, on App and AsyncApp, asserted on the broker.

Run the suite once per broker (AMQP_URL=...:5672 for 3.10, ...:5673 for 4.3): each
test reads the version the broker reports and expects that version's behaviour.
The in-memory broker runs here twice: under RabbitMQ 3.13's rules ("memory") and
under 4.3's ("memory-4.3"); each announces the version it follows.
The headers are read back by a plain pika client (basic.get), not by ackkit.
"""

from __future__ import annotations

import itertools
import json
import logging
import threading
import time
from typing import Any

import pytest

from ackkit import AckMode, Consumer, Delivery, Queue, RequeueMessage, Retry, RetryStrategy
from ackkit._core.brokers import BrokerTraits, traits_of
from ackkit._core.events import Counters
from ackkit.errors import TopologyConflict
from ackkit.testing import InMemoryBroker

from .conftest import IO, Broker, Runtime, eventually

pytestmark = pytest.mark.contract

QUORUM = {"x-queue-type": "quorum"}


@pytest.fixture
def transport(version_transport: str) -> str:
    """Every version test runs on the in-memory broker under 3.13's and 4.3's rules."""
    return version_transport


def _queue_arguments(broker: Broker, queue: str) -> str:
    """The arguments `queue` was declared with, as JSON (the node's list, or the model's)."""
    if isinstance(broker.handle, InMemoryBroker):
        with broker.handle.model.lock:
            return json.dumps(broker.handle.model.queues[queue].arguments)
    declared = broker.handle.declared(queue)
    assert declared is not None, f"no queue {queue!r}"
    return json.dumps(declared.arguments)


@pytest.fixture
def traits(broker: Broker) -> BrokerTraits:
    conn = broker.handle.connect()
    try:
        return traits_of(conn._impl.server_properties)
    finally:
        conn.close()


def _get_all(broker: Broker, queue: str) -> list[tuple[bool, dict[str, Any]]]:
    """(redelivered, headers) of every ready message, taken with basic.get + ack."""
    out: list[tuple[bool, dict[str, Any]]] = []
    conn = broker.handle.connect()
    try:
        ch = conn.channel()
        while True:
            method, props, _body = ch.basic_get(queue, auto_ack=False)
            if method is None:
                return out
            out.append((bool(method.redelivered), dict(props.headers or {})))
            ch.basic_ack(method.delivery_tag)
    finally:
        conn.close()


class Gate:
    """A handler waits here until the test opens it (set from a timer once the app is
    stopping, so that the stop finds this handler in flight and the rest prefetched)."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.open = threading.Event()

    async def hold(self, io: IO) -> None:
        self.started.set()
        while not self.open.is_set():
            await io.sleep(0.02)

    def open_later(self, seconds: float = 1.0) -> None:
        threading.Timer(seconds, self.open.set).start()


def _counts(app: Any) -> Counters:
    """The only listener's counters (still readable after the app stopped)."""
    ((_spec, core),) = app._cores.values()
    counters: Counters = core.counters
    return counters


def test_a_failure_is_a_reject_that_counts_toward_the_delivery_limit(
    runtime: Runtime, broker: Broker, queue_factory: Any, traits: BrokerTraits
) -> None:
    """RequeueMessage settles with basic.reject: on every version it increments the quorum
    queue's x-delivery-count (what its delivery-limit counts)."""
    q = queue_factory()
    gate = Gate()
    runs: list[int] = []

    async def fail(payload: Any, d: Delivery, io: IO) -> None:
        runs.append(d.attempt)
        if len(runs) == 4:
            await gate.hold(io)
        raise RequeueMessage("try again")

    app = runtime.app()
    runtime.listen(
        app,
        Queue(q, arguments=QUORUM),
        fail,
        consumer=Consumer(prefetch=1),
        retry=Retry(max_attempts=10),
    )
    with runtime.running(app):
        counts = _counts(app)
        broker.publish(q, [b"{}"], content_type=None)
        eventually(gate.started.is_set, what="the fourth run")
        gate.open_later()
    stats = counts.snapshot()
    failures, returned = stats["requeued"], stats["returned"]
    assert runs == [1, 2, 3, 4] and failures == 4
    ((redelivered, headers),) = _get_all(broker, q)
    assert redelivered
    if traits.reject_counts_nack_does_not:  # 4.3+: only the rejects count
        assert headers["x-delivery-count"] == failures
        assert headers["x-acquired-count"] == failures + returned
    else:  # every return counts
        assert headers["x-delivery-count"] == failures + returned
        assert "x-acquired-count" not in headers


def test_a_return_at_shutdown_keeps_its_attempt_on_every_version(
    runtime: Runtime, broker: Broker, queue_factory: Any
) -> None:
    """Prefetched deliveries whose handler never started go back at shutdown as copies
    carrying the attempt they had (then the originals are acked): every version counts
    a basic.nack somewhere (x-delivery-count before 4.3, x-acquired-count on 4.3, the
    redelivered flag on classic queues), so a graceful stop cost each an attempt."""
    q = queue_factory()
    gate = Gate()

    async def slow(payload: Any, d: Delivery, io: IO) -> None:
        await gate.hold(io)

    app = runtime.app()
    runtime.listen(
        app,
        Queue(q, arguments=QUORUM),
        slow,
        consumer=Consumer(prefetch=10, concurrency=1),
    )
    with runtime.running(app):
        broker.publish(q, [b"{}"] * 5, content_type=None)
        eventually(gate.started.is_set, what="the first handler started")
        broker.wait_for(q, unacked=5)
        counts = _counts(app)
        gate.open_later()
    returned = counts.snapshot()["returned"]
    assert returned == 4
    got = _get_all(broker, q)
    assert len(got) == returned  # the first was handled and acked; nothing else lost
    for redelivered, headers in got:
        assert not redelivered
        assert headers["ackkit-attempt"] == 1
        assert headers.get("x-delivery-count", 0) == 0
        assert headers.get("x-acquired-count", 0) == 0


def test_attempts_after_a_return_ignore_a_publishers_delivery_count(
    runtime: Runtime, broker: Broker, queue_factory: Any
) -> None:
    """A publisher's x-delivery-count 7 survives a basic.nack on RabbitMQ 4.3 (the broker
    writes the header only once it incremented the count). A message returned unstarted
    at shutdown goes back as a copy without it, keeping its attempt: attempt 1 on every
    version (it was attempt 2 before a stop kept attempts; never 8, which would
    dead-letter it at once)."""
    q = queue_factory()
    gate = Gate()

    async def slow(payload: Any, d: Delivery, io: IO) -> None:
        await gate.hold(io)

    app = runtime.app()
    retry = Retry(max_attempts=3)
    runtime.listen(
        app,
        Queue(q, arguments=QUORUM),
        slow,
        consumer=Consumer(prefetch=10, concurrency=1),
        retry=retry,
    )
    with runtime.running(app):
        broker.publish(q, [b"{}"] * 3, content_type=None, headers={"x-delivery-count": 7})
        eventually(gate.started.is_set, what="the first handler started")
        broker.wait_for(q, unacked=3)
        counts = _counts(app)
        gate.open_later()
    returned = counts.snapshot()["returned"]
    assert returned == 2
    seen: list[int] = []

    async def record(payload: Any, d: Delivery, io: IO) -> None:
        seen.append(d.attempt)

    app2 = runtime.app()
    runtime.listen(app2, Queue(q, arguments=QUORUM), record, retry=retry)
    with runtime.running(app2):
        broker.wait_for(q, ready=0, unacked=0)
        eventually(lambda: len(seen) == returned, what="the returned messages handled")
    assert seen == [1] * returned
    assert broker.counts(f"{q}.dlq").total == 0


def test_a_consumer_timeout_on_43_cancels_the_consumer_and_ackkit_consumes_again(
    runtime: Runtime,
    broker: Broker,
    queue_factory: Any,
    traits: BrokerTraits,
    caplog: pytest.LogCaptureFixture,
) -> None:
    if not traits.timeout_cancels_consumer:
        pytest.skip(f"RabbitMQ {traits.series}: a consumer timeout closes the channel")
    q = queue_factory()
    calls: list[tuple[int, float]] = []

    counted: list[Any] = []

    async def slow_once(payload: Any, d: Delivery, io: IO) -> None:
        calls.append((d.attempt, time.monotonic()))
        counted.append(d.headers.get("x-delivery-count"))
        if len(calls) == 1:
            await io.sleep(4.0)  # past the queue's 1 s consumer timeout

    app = runtime.app()
    args = {**QUORUM, "x-consumer-timeout": 1000}
    runtime.listen(
        app,
        Queue(q, arguments=args),
        slow_once,
        consumer=Consumer(prefetch=5, concurrency=2),
    )
    with caplog.at_level(logging.INFO, logger="ackkit"), runtime.running(app):
        broker.publish(q, [json.dumps({"n": 1})], content_type=None)
        eventually(lambda: len(calls) >= 2, timeout=30, what="handled again")
        broker.wait_for(q, ready=0, unacked=0, consumers=1, timeout=30)
        time.sleep(4.5)  # the slow first run ends: its ack must be dropped, not sent
        broker.wait_for(q, ready=0, unacked=0, consumers=1)
        stats = runtime.stats(app)
    assert stats["consumer_cancelled"] == 1
    assert stats["acked"] == 1  # the redelivery; the slow run's settle was fenced
    if runtime.kind == "sync":  # AsyncApp cancels the handler task with the channel
        assert stats["dropped_stale"] == 1
    assert [a for a, _ in calls] == [1, 2]  # x-acquired-count: the lost run counted
    assert counted == [None, None]  # a consumer timeout does not count as a delivery
    gap = calls[1][1] - calls[0][1]
    print(f"consumer timeout 1 s: handled again after {gap:.2f} s")
    assert 0.9 < gap < 20, gap
    assert "broker cancelled the consumer" in caplog.text
    assert "unknown delivery tag" not in caplog.text
    assert broker.counts(f"{q}.dlq").total == 0


def test_classic_v1_arguments_never_reach_a_43_broker(
    runtime: Runtime,
    broker: Broker,
    queue_factory: Any,
    traits: BrokerTraits,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """RabbitMQ 4.3 refuses x-queue-version 1 (PRECONDITION_FAILED): ackkit leaves it
    and x-queue-mode off there, says so, and consumes; older brokers get them."""
    q = queue_factory()
    seen: list[int] = []

    async def handle(payload: Any, d: Delivery, io: IO) -> None:
        seen.append(1)

    app = runtime.app()
    args = {"x-queue-version": 1, "x-queue-mode": "lazy"}
    runtime.listen(app, Queue(q, arguments=args), handle)
    with caplog.at_level(logging.WARNING, logger="ackkit"), runtime.running(app):
        broker.publish(q, [b"{}"], content_type=None)
        eventually(lambda: seen == [1], what="handled")
        broker.wait_for(q, ready=0, unacked=0)
    declared = _queue_arguments(broker, q)
    if traits.classic_v1_arguments:
        assert "x-queue-version" in declared and "x-queue-mode" in declared
        assert "declared without" not in caplog.text
    else:
        assert "x-queue-version" not in declared and "x-queue-mode" not in declared
        assert "declared without x-queue-mode='lazy', x-queue-version=1" in caplog.text


def test_quorum_delayed_retry_on_43_and_refused_before(
    runtime: Runtime, broker: Broker, queue_factory: Any, traits: BrokerTraits
) -> None:
    """RetryStrategy.QUORUM_DELAYED: the failed delivery is rejected back to its quorum
    queue, which holds it min(0.5 s * n, 1 s); after 4 attempts the DLQ. No delay queue.
    On a broker without native delayed retry start() says so."""
    q = queue_factory()
    runs: list[tuple[int, float]] = []

    async def fail(payload: Any, d: Delivery, io: IO) -> None:
        runs.append((d.attempt, time.monotonic()))
        raise ValueError(f"attempt {d.attempt}")

    app = runtime.app()
    retry = Retry(
        max_attempts=4,
        initial_interval=0.5,
        max_interval=1.0,
        strategy=RetryStrategy.QUORUM_DELAYED,
    )
    runtime.listen(app, Queue(q, arguments=QUORUM), fail, retry=retry)
    if not traits.native_delayed_retry:
        with pytest.raises(TopologyConflict, match=r"needs RabbitMQ 4\.3"), runtime.running(app):
            pass
        return
    with runtime.running(app):
        broker.publish(q, [b"{}"], content_type=None)
        broker.wait_for(f"{q}.dlq", ready=1, timeout=30)
        broker.wait_for(q, ready=0, unacked=0)
    assert [a for a, _ in runs] == [1, 2, 3, 4]
    gaps = [round(b - a, 2) for (_, a), (_, b) in itertools.pairwise(runs)]
    print(f"quorum delayed retry: gaps between attempts {gaps} (queue: 0.5, 1.0, 1.0)")
    for gap, want in zip(gaps, (0.5, 1.0, 1.0), strict=True):
        assert want - 0.05 <= gap <= want + 2.0, gaps
    (dead,) = broker.take_all(f"{q}.dlq")
    assert dead.headers["ackkit-attempts"] == 4
    assert dead.headers["ackkit-reason"] == "attempts exhausted (4 of 4)"
    names = broker.handle.queue_names()
    assert not [n for n in names if n.startswith(f"{q}.retry.")]  # no delay queue
    assert "x-delayed-retry-type" in _queue_arguments(broker, q)


def test_a_requeue_loop_ends_at_the_4x_default_delivery_limit(
    runtime: Runtime, broker: Broker, queue_factory: Any, traits: BrokerTraits
) -> None:
    """What docs/guide/rabbitmq-versions.md warns of: on RabbitMQ 4.x a quorum queue
    without its own x-delivery-limit drops a message after 20 returns that count (no DLX here), so a
    handler that always raises RequeueMessage sees it 21 times, then never again."""
    if traits.default_delivery_limit is None:
        pytest.skip(f"RabbitMQ {traits.series}: no default delivery-limit")
    q = queue_factory()
    runs: list[int] = []

    async def requeue(payload: Any, d: Delivery, io: IO) -> None:
        runs.append(d.attempt)
        raise RequeueMessage("again")

    app = runtime.app()
    runtime.listen(app, Queue(q, arguments=QUORUM), requeue, consumer=Consumer(prefetch=1))
    with runtime.running(app):
        broker.publish(q, [b"{}"], content_type=None)
        broker.wait_for(q, total=0, timeout=30)
        eventually(lambda: len(runs) == traits.default_delivery_limit + 1, what="21 runs")
        time.sleep(0.5)
    assert len(runs) == traits.default_delivery_limit + 1
    assert broker.counts(q).total == 0 and broker.counts(f"{q}.dlq").total == 0


def test_a_handlers_reject_counts_and_its_nack_does_not_on_43(
    runtime: Runtime, broker: Broker, queue_factory: Any, traits: BrokerTraits
) -> None:
    """delivery.reject(requeue=True) is basic.reject, delivery.nack(requeue=True) is
    basic.nack: the third delivery shows what the broker counted."""
    q = queue_factory()
    seen: list[dict[str, Any]] = []

    async def settle(payload: Any, d: Delivery, io: IO) -> None:
        seen.append(dict(d.headers))
        if len(seen) == 1:
            await io.reject(d, requeue=True)
        elif len(seen) == 2:
            await io.nack(d, requeue=True)
        else:
            await io.ack(d)

    app = runtime.app()
    runtime.listen(
        app,
        Queue(q, arguments=QUORUM),
        settle,
        ack_mode=AckMode.MANUAL,
        consumer=Consumer(prefetch=1),
    )
    with runtime.running(app):
        broker.publish(q, [b"{}"], content_type=None)
        eventually(lambda: len(seen) == 3, what="three deliveries")
        broker.wait_for(q, ready=0, unacked=0)
    third = seen[2]
    if runtime.kind == "amqp10":
        # over AMQP 1.0 both are modified(delivery-failed), which the broker counts: a
        # handler's requeue counts as over 0-9-1 on 4.3 (x-acquired-count), and is bounded
        assert (third["x-delivery-count"], third["x-acquired-count"]) == (2, 2)
    elif traits.reject_counts_nack_does_not:
        assert (third["x-delivery-count"], third["x-acquired-count"]) == (1, 2)
    else:
        assert third["x-delivery-count"] == 2
