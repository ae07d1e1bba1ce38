"""Behaviour contract: every test runs on the pika App and on AsyncApp against a real broker.

Assertions read the broker: queue counts (ready / unacked), and what landed
in the dead-letter queue with which headers.
"""

from __future__ import annotations

import json
import logging
import random
import re
import threading
import time
from typing import Any

import pytest
from pydantic import BaseModel

from ackkit import (
    AckIndex,
    AckMode,
    Batch,
    Consumer,
    DeadLetterMessage,
    Delivery,
    RejectMessage,
    RequeueMessage,
    Retry,
    RetryLater,
    RetryStrategy,
)
from ackkit.errors import AckkitError, AlreadySettled, TopologyConflict
from ackkit.observability import Event, Stage

from .conftest import IO, Broker, Runtime, eventually

pytestmark = pytest.mark.contract


class Order(BaseModel):
    id: int
    sku: str


def bodies(n: int, start: int = 0) -> list[str | bytes]:
    return [json.dumps({"id": i, "sku": f"s{i}"}) for i in range(start, start + n)]


class Calls:
    """Thread-safe record of what handlers saw."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.items: list[Any] = []

    def add(self, x: Any) -> None:
        with self.lock:
            self.items.append(x)

    def __len__(self) -> int:
        return len(self.items)


def stale_tag_errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    bad = (
        "PRECONDITION_FAILED",
        "unknown delivery tag",
        "closed by broker",
        "closed by the broker",
    )
    return [r.getMessage() for r in caplog.records if any(b in r.getMessage() for b in bad)]


# -- acknowledgement ---------------------------------------------------------------


def test_auto_ack_drains_the_queue(runtime: Runtime, broker: Broker, queue_factory: Any) -> None:
    q = queue_factory(declare=True)
    seen = Calls()

    async def handle(order: Order, d: Delivery, io: IO) -> None:
        seen.add(order.id)

    app = runtime.app()
    runtime.listen(app, q, handle, Order, ack_mode=AckMode.AUTO, consumer=Consumer(prefetch=20))
    broker.publish(q, bodies(30))
    with runtime.running(app):
        eventually(lambda: len(seen) == 30, what="30 handled")
        broker.wait_for(q, ready=0, unacked=0)
    assert sorted(seen.items) == list(range(30))
    assert broker.counts(q).total == 0


def test_raising_handler_dead_letters_with_reason(
    runtime: Runtime, broker: Broker, queue_factory: Any
) -> None:
    q = queue_factory(declare=True)

    async def handle(order: Order, d: Delivery, io: IO) -> None:
        raise ValueError(f"boom {order.id}")

    app = runtime.app()
    runtime.listen(app, q, handle, Order)
    broker.publish(q, bodies(3))
    with runtime.running(app):
        broker.wait_for(f"{q}.dlq", ready=3)
        broker.wait_for(q, ready=0, unacked=0)
    dead = broker.take_all(f"{q}.dlq")
    assert len(dead) == 3
    for m in dead:
        h = m.headers
        assert h["ackkit-error-type"] == "ValueError"
        assert h["ackkit-error-message"].startswith("boom ")
        assert "attempts exhausted" in h["ackkit-reason"]
        assert h["ackkit-original-queue"] == q
        assert h["ackkit-attempts"] == 1
        assert "ValueError" in h["ackkit-error-traceback"]
        assert json.loads(m.body)["sku"].startswith("s")  # body preserved


def test_bad_payload_goes_to_the_dead_letter_queue(
    runtime: Runtime, broker: Broker, queue_factory: Any
) -> None:
    q = queue_factory(declare=True)
    seen = Calls()

    async def handle(order: Order, d: Delivery, io: IO) -> None:
        seen.add(order.id)

    app = runtime.app()
    runtime.listen(app, q, handle, Order)
    broker.publish(q, ["{not json", json.dumps({"id": "x"}), json.dumps({"id": 7, "sku": "k"})])
    with runtime.running(app):
        broker.wait_for(f"{q}.dlq", ready=2)
        broker.wait_for(q, ready=0, unacked=0)
    assert seen.items == [7]
    reasons = sorted(m.headers["ackkit-reason"] for m in broker.take_all(f"{q}.dlq"))
    assert all(r.startswith("bad payload") for r in reasons), reasons
    assert any("Order" in r for r in reasons)


def test_a_deleted_dead_letter_queue_is_declared_again(
    runtime: Runtime, broker: Broker, queue_factory: Any
) -> None:
    q = queue_factory(declare=True)
    calls = Calls()

    async def handle(order: Order, d: Delivery, io: IO) -> None:
        calls.add(order.id)
        raise ValueError("poison")

    app = runtime.app()
    runtime.listen(app, q, handle, Order)
    with runtime.running(app):
        broker.handle.delete(f"{q}.dlq")  # deleted while the app runs
        broker.publish(q, bodies(2))
        broker.wait_for(f"{q}.dlq", ready=2)
        broker.wait_for(q, ready=0, unacked=0)
        st = runtime.stats(app)
    assert sorted(calls.items) == [0, 1]  # not looped through the handler
    assert st["requeued"] == 0


def test_manual_forgotten_ack_is_dead_lettered_not_stuck(
    runtime: Runtime, broker: Broker, queue_factory: Any
) -> None:
    q = queue_factory(declare=True)

    async def handle(d: Delivery, _d: Delivery, io: IO) -> None:
        return None  # never settles

    app = runtime.app()
    runtime.listen(app, q, handle, ack_mode=AckMode.MANUAL, consumer=Consumer(prefetch=5))
    broker.publish(q, bodies(4))
    with runtime.running(app):
        broker.wait_for(f"{q}.dlq", ready=4)
        broker.wait_for(q, ready=0, unacked=0)
    dead = broker.take_all(f"{q}.dlq")
    assert {m.headers["ackkit-reason"] for m in dead} == {"handler returned without settling"}


def test_settle_twice_raises_already_settled(
    runtime: Runtime, broker: Broker, queue_factory: Any
) -> None:
    q = queue_factory(declare=True)
    outcomes = Calls()

    async def handle(d: Delivery, _d: Delivery, io: IO) -> None:
        await io.ack(d)
        try:
            await io.ack(d)
        except AlreadySettled:
            outcomes.add("AlreadySettled")
        else:
            outcomes.add("second ack accepted")

    app = runtime.app()
    runtime.listen(app, q, handle, ack_mode=AckMode.MANUAL)
    broker.publish(q, bodies(2))
    with runtime.running(app):
        eventually(lambda: len(outcomes) == 2)
        broker.wait_for(q, ready=0, unacked=0)
    assert outcomes.items == ["AlreadySettled", "AlreadySettled"]
    assert broker.take_all(f"{q}.dlq") == []


def test_client_ack_is_a_multiple_ack(runtime: Runtime, broker: Broker, queue_factory: Any) -> None:
    q = queue_factory(declare=True)
    acked_at = Calls()

    async def handle(d: Delivery, _d: Delivery, io: IO) -> None:
        if d.delivery_tag % 5 == 0:  # the others stay unsettled until this ack covers them
            acked_at.add(d.delivery_tag)
            await io.ack(d)

    app = runtime.app()
    runtime.listen(app, q, handle, ack_mode=AckMode.CLIENT, consumer=Consumer(prefetch=10))
    broker.publish(q, bodies(10))
    with runtime.running(app):
        broker.wait_for(q, ready=0, unacked=0)
        st = runtime.stats(app)
    assert acked_at.items == [5, 10]
    assert st["acked"] == 10
    assert st["ack_frames"] == 2
    assert st["dead_lettered"] == 0 and st["unsettled"] == 0


def test_nack_multiple_without_requeue_every_fifth(
    runtime: Runtime, broker: Broker, queue_factory: Any
) -> None:
    """Seed 000: basicNack(tag, multiple=true, requeue=false) when deliveryTag % 5 == 0."""
    q = queue_factory(declare=True)

    async def handle(d: Delivery, _d: Delivery, io: IO) -> None:
        if d.delivery_tag % 5 == 0:
            await io.nack(d, requeue=False, multiple=True)

    app = runtime.app()
    runtime.listen(app, q, handle, ack_mode=AckMode.CLIENT, consumer=Consumer(prefetch=10))
    broker.publish(q, bodies(10))
    with runtime.running(app):
        broker.wait_for(f"{q}.dlq", ready=10)
        broker.wait_for(q, ready=0, unacked=0)
    dead = broker.take_all(f"{q}.dlq")
    assert sorted(json.loads(m.body)["id"] for m in dead) == list(range(10))
    assert {m.headers["ackkit-reason"] for m in dead} == {"nack without requeue by handler"}


def test_signals_choose_the_outcome(runtime: Runtime, broker: Broker, queue_factory: Any) -> None:
    """RequeueMessage puts it back (and counts an attempt); RejectMessage and
    DeadLetterMessage dead-letter it with their reason."""
    q = queue_factory(declare=True)
    calls = Calls()

    async def handle(order: Order, d: Delivery, io: IO) -> None:
        calls.add((order.id, d.attempt))
        if order.id == 0 and d.attempt == 1:
            raise RequeueMessage("not ready")
        if order.id == 1:
            raise RejectMessage("refused by the handler")
        if order.id == 2:
            raise DeadLetterMessage("poison: sku unknown")

    app = runtime.app()
    runtime.listen(app, q, handle, Order)
    broker.publish(q, bodies(3))
    with runtime.running(app):
        broker.wait_for(f"{q}.dlq", ready=2)
        eventually(lambda: (0, 2) in calls.items, what="the requeued delivery's second attempt")
        broker.wait_for(q, ready=0, unacked=0)
    assert sorted(calls.items) == [(0, 1), (0, 2), (1, 1), (2, 1)]
    dead = {json.loads(m.body)["id"]: m.headers for m in broker.take_all(f"{q}.dlq")}
    assert dead[1]["ackkit-reason"] == "refused by the handler"
    assert dead[2]["ackkit-reason"] == "poison: sku unknown"
    assert dead[2]["ackkit-error-type"].endswith("DeadLetterMessage")


# -- retry -----------------------------------------------------------------------------


def test_retry_later_with_broker_strategy_then_dead_letter(
    runtime: Runtime, broker: Broker, queue_factory: Any
) -> None:
    q = queue_factory(declare=True)
    attempts = Calls()

    async def handle(order: Order, d: Delivery, io: IO) -> None:
        attempts.add((order.id, d.attempt))
        raise RetryLater("not yet")

    app = runtime.app()
    retry = Retry(max_attempts=3, initial_interval=0.05, strategy=RetryStrategy.BROKER)
    runtime.listen(app, q, handle, Order, retry=retry)
    broker.publish(q, bodies(2))
    with runtime.running(app):
        broker.wait_for(f"{q}.dlq", ready=2)
        broker.wait_for(q, ready=0, unacked=0)
    assert sorted(attempts.items) == [(0, 1), (0, 2), (0, 3), (1, 1), (1, 2), (1, 3)]
    dead = broker.take_all(f"{q}.dlq")
    assert [m.headers["ackkit-attempts"] for m in dead] == [3, 3]
    assert all("attempts exhausted (3 of 3)" in m.headers["ackkit-reason"] for m in dead)
    assert broker.counts(f"{q}.retry.50ms").total == 0


def test_retry_later_with_its_own_delay_declares_the_delay_queue_once(
    runtime: Runtime, broker: Broker, queue_factory: Any
) -> None:
    """Several deliveries ask for the same non-tier delay at once: the delay queue is
    declared before any copy is published to it, so none comes back unroutable."""
    q = queue_factory(declare=True)
    attempts = Calls()

    async def handle(order: Order, d: Delivery, io: IO) -> None:
        attempts.add((order.id, d.attempt))
        if d.attempt == 1:
            raise RetryLater("custom delay", delay=0.12)

    app = runtime.app()
    runtime.listen(app, q, handle, Order, retry=Retry(max_attempts=2, initial_interval=0.05))
    broker.publish(q, bodies(6))
    with runtime.running(app):
        eventually(lambda: len(attempts) == 12, what="6 deliveries, 2 attempts each")
        broker.wait_for(q, ready=0, unacked=0)
        st = runtime.stats(app)
    assert sorted(attempts.items) == sorted((i, a) for i in range(6) for a in (1, 2))
    assert st["requeued"] == 0 and st["dead_lettered"] == 0
    assert broker.counts(f"{q}.retry.120ms").total == 0


def test_in_process_retry_three_attempts(
    runtime: Runtime, broker: Broker, queue_factory: Any
) -> None:
    q = queue_factory(declare=True)
    attempts = Calls()

    async def handle(order: Order, d: Delivery, io: IO) -> None:
        attempts.add(d.attempt)
        if d.attempt < 3:
            raise ConnectionError("flaky")

    app = runtime.app()
    retry = Retry(max_attempts=3, initial_interval=0.02, strategy=RetryStrategy.IN_PROCESS)
    runtime.listen(app, q, handle, Order, retry=retry)
    broker.publish(q, bodies(1))
    with runtime.running(app):
        eventually(lambda: len(attempts) == 3)
        broker.wait_for(q, ready=0, unacked=0)
        st = runtime.stats(app)
    assert attempts.items == [1, 2, 3]
    assert st["retrying"] == 2 and st["acked"] == 1 and st["dead_lettered"] == 0
    assert broker.take_all(f"{q}.dlq") == []


# -- concurrency, batches ---------------------------------------------------------------


def test_out_of_order_completion_never_acks_an_unsettled_tag(
    runtime: Runtime, broker: Broker, queue_factory: Any, caplog: pytest.LogCaptureFixture
) -> None:
    q = queue_factory(declare=True)
    n = 80
    seen = Calls()
    rnd = random.Random(1234)
    delays = [rnd.uniform(0, 0.03) for _ in range(n)]

    async def handle(order: Order, d: Delivery, io: IO) -> None:
        await io.sleep(delays[order.id])
        seen.add(order.id)

    app = runtime.app()
    runtime.listen(app, q, handle, Order, consumer=Consumer(prefetch=20, concurrency=8))
    broker.publish(q, bodies(n))
    caplog.set_level(logging.INFO, logger="ackkit")
    with runtime.running(app):
        eventually(lambda: len(seen) == n, what=f"{n} handled")
        broker.wait_for(q, ready=0, unacked=0)
        st = runtime.stats(app)
    assert sorted(seen.items) == list(range(n))  # each exactly once: no channel loss, no redelivery
    assert seen.items != sorted(seen.items)  # they really completed out of order
    assert st["received"] == n and st["acked"] == n
    assert st["dropped_stale"] == 0 and st["dead_lettered"] == 0
    assert stale_tag_errors(caplog) == []


def test_batch_handler_with_ack_index(runtime: Runtime, broker: Broker, queue_factory: Any) -> None:
    q = queue_factory(declare=True)
    batches = Calls()

    async def handle(orders: list[Order], ds: Any, io: IO) -> AckIndex:
        batches.add([o.id for o in orders])
        return AckIndex(len(orders) - 2)  # the last one of each batch is not acknowledged

    app = runtime.app()
    runtime.listen(
        app,
        q,
        handle,
        list[Order],
        consumer=Consumer(prefetch=10),
        batch=Batch(5, timeout=0.5),
    )
    broker.publish(q, bodies(10))
    with runtime.running(app):
        broker.wait_for(f"{q}.dlq", ready=2)
        broker.wait_for(q, ready=0, unacked=0)
    assert sorted(i for b in batches.items for i in b) == list(range(10))
    dead = broker.take_all(f"{q}.dlq")
    assert sorted(json.loads(m.body)["id"] for m in dead) == [4, 9]


# -- lifecycle --------------------------------------------------------------------------


def test_graceful_shutdown_leaves_nothing_unacked(
    runtime: Runtime, broker: Broker, queue_factory: Any
) -> None:
    q = queue_factory(declare=True)
    n = 40
    done = Calls()

    async def handle(order: Order, d: Delivery, io: IO) -> None:
        await io.sleep(0.05)
        done.add(order.id)

    app = runtime.app()
    runtime.listen(app, q, handle, Order, consumer=Consumer(prefetch=20, concurrency=2))
    broker.publish(q, bodies(n))
    with runtime.running(app):
        eventually(lambda: len(done) >= 6)
        # leaving the block: cancel, finish the running handlers, requeue the prefetched rest
    c = broker.wait_for(q, unacked=0, consumers=0)
    handled = len(done)
    assert handled < n
    assert c.ready == n - handled  # every finished one acked, every other one back on the queue
    assert broker.counts(f"{q}.dlq").total == 0


def test_stats_keep_the_last_counters_after_stop(
    runtime: Runtime, broker: Broker, queue_factory: Any
) -> None:
    """A test reads the final counters once the app has stopped; they match the broker."""
    q = queue_factory(declare=True)
    n = 7

    async def handle(order: Order, d: Delivery, io: IO) -> None:
        if order.id == 3:
            raise ValueError("bad order")

    app = runtime.app()
    assert app.stats() == {}  # type: ignore[attr-defined]
    runtime.listen(app, q, handle, Order)
    broker.publish(q, bodies(n))
    with runtime.running(app):
        broker.wait_for(q, ready=0, unacked=0)
        broker.wait_for(f"{q}.dlq", ready=1)
        running = runtime.stats(app)
    assert not app.is_running  # type: ignore[attr-defined]
    after = runtime.stats(app)
    assert after["received"] == n and after["acked"] == n - 1 and after["dead_lettered"] == 1
    assert after == runtime.stats(app)  # a snapshot that stays
    assert running["received"] == n


def test_a_slow_observer_delays_no_ack_and_no_heartbeat(
    runtime: Runtime, broker: Broker, queue_factory: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """An event observer that blocks holds up nothing but later events: the deliveries are
    handled and acked meanwhile, and the connection (heartbeat 1 s) stays up. Once the
    app has stopped, the observer has heard every event, in order."""
    caplog.set_level(logging.WARNING, logger="ackkit")
    q = queue_factory(declare=True)
    n = 5
    gate = threading.Event()
    heard: list[Event] = []

    async def handle(order: Order, d: Delivery, io: IO) -> None:
        pass

    app = runtime.app(heartbeat=1)

    @app.on_event  # type: ignore[attr-defined]
    def slow(ev: Event) -> None:
        gate.wait(60)  # blocks until the test lets it go
        heard.append(ev)

    runtime.listen(app, q, handle, Order)
    with runtime.running(app):
        broker.publish(q, bodies(n))
        broker.wait_for(q, ready=0, unacked=0, timeout=30)  # all acked, observer still blocked
        assert heard == []
        time.sleep(4.0)  # four heartbeat intervals with the observer blocked
        assert runtime.stats(app)["acked"] == n
        gate.set()
    lost = [r.getMessage() for r in caplog.records if "lost" in r.getMessage()]
    assert lost == []  # no missed heartbeats, no reconnect
    assert len(heard) == 2 * n  # every event heard by the time stop() returned
    for tag in {e.tag for e in heard}:
        assert [e.stage for e in heard if e.tag == tag] == [Stage.RECEIVED, Stage.ACKED]


def test_pull_mode_get_ack_reject_requeue(
    runtime: Runtime, broker: Broker, queue_factory: Any
) -> None:
    q = queue_factory(declare=True)
    broker.publish(q, bodies(2))
    with runtime.pull() as conn:
        a = conn.get(q)
        assert a is not None and json.loads(a.body)["id"] == 0
        broker.wait_for(q, ready=1, unacked=1)
        conn.ack(a)
        with pytest.raises(AlreadySettled):
            conn.ack(a)
        broker.wait_for(q, ready=1, unacked=0)
        b = conn.get(q)
        assert b is not None and json.loads(b.body)["id"] == 1
        conn.reject(b, requeue=True)
        broker.wait_for(q, ready=1, unacked=0)
        again = conn.get(q)
        assert again is not None and again.redelivered and again.attempt == 2
        conn.reject(again, requeue=False)  # dead-lettered with its reason
        assert conn.get(q) is None
    broker.wait_for(q, ready=0, unacked=0)
    (dead,) = broker.take_all(f"{q}.dlq")
    assert dead.headers["ackkit-reason"] == "reject without requeue by handler"


def test_reconnect_after_the_broker_closes_connections(
    runtime: Runtime, broker: Broker, queue_factory: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Connections are closed while handlers run and acks are pending: after the reconnect
    nothing of the old channel is sent on the new one, and consumption goes on."""
    q = queue_factory(declare=True)
    seen = Calls()

    async def handle(order: Order, d: Delivery, io: IO) -> None:
        await io.sleep(0.01)
        seen.add(order.id)

    app = runtime.app()
    runtime.listen(app, q, handle, Order, consumer=Consumer(prefetch=50, concurrency=2))
    caplog.set_level(logging.INFO, logger="ackkit")
    broker.publish(q, bodies(40))
    with runtime.running(app):
        eventually(lambda: len(seen) >= 10)
        assert broker.close_connections_named(runtime.connection_name) >= 1
        broker.publish(q, bodies(10, start=40))
        eventually(lambda: len({*seen.items}) == 50, timeout=20, what="50 handled after reconnect")
        broker.wait_for(q, ready=0, unacked=0, consumers=1)
    assert {*seen.items} == set(range(50))
    assert stale_tag_errors(caplog) == []


def test_handler_still_running_at_shutdown_is_requeued_not_dead_lettered(
    runtime: Runtime, broker: Broker, queue_factory: Any
) -> None:
    q = queue_factory(declare=True)
    started = Calls()

    async def handle(order: Order, d: Delivery, io: IO) -> None:
        started.add(order.id)
        await io.sleep(3.0)  # outlives the shutdown timeout

    app = runtime.app(shutdown_timeout=0.3)
    runtime.listen(app, q, handle, Order, consumer=Consumer(prefetch=5))
    broker.publish(q, bodies(3))
    with runtime.running(app):
        eventually(lambda: len(started) == 1)
    broker.wait_for(q, ready=3, unacked=0)
    assert broker.counts(f"{q}.dlq").total == 0


def test_topology_conflict_is_reported(
    runtime: Runtime, broker: Broker, queue_factory: Any
) -> None:
    q = queue_factory(declare=True)
    conn = broker.handle.connect()
    try:
        conn.channel().queue_declare(f"{q}.dlq", durable=True, arguments={"x-max-length": 1})
    finally:
        conn.close()

    async def handle(d: Delivery, _d: Delivery, io: IO) -> None:
        return None

    app = runtime.app()
    runtime.listen(app, q, handle)
    with (
        pytest.raises(TopologyConflict, match=r"already exists with arguments"),
        runtime.running(app),
    ):
        pass
    broker.wait_for(q, consumers=0)


def test_refused_login_fails_start_at_once(runtime: Runtime, queue_factory: Any) -> None:
    q = queue_factory()
    bad = re.sub(r"^(amqps?://[^:@/]+):[^@/]*@", r"\1:not-the-password@", runtime.url)
    assert bad != runtime.url
    runtime.url = bad

    async def handle(d: Delivery, _d: Delivery, io: IO) -> None:
        return None

    app = runtime.app(startup_timeout=120)
    runtime.listen(app, q, handle)
    t0 = time.monotonic()
    with pytest.raises(AckkitError, match=r"(?i)refused|authentication"), runtime.running(app):
        pass
    assert time.monotonic() - t0 < 30  # not retried until the startup timeout (120 s)
