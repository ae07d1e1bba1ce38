"""Seed 000/001 scenarios on a real broker, asserting the queue table the broker shows.

Each test mirrors a `rabbitmqctl list_queues` observation from the source
documents (ready / unacked), plus what ackkit adds (nothing silently lost).
"""

from __future__ import annotations

import contextlib
import json
import random
import threading
import time
import uuid
from collections import Counter

import pytest

import ackkit
from ackkit import AckMode, App, Consumer, Delivery, FlushPolicy, Unsettled

pytestmark = pytest.mark.integration


@pytest.fixture
def q(rabbitmq):
    name = f"t.seed.{uuid.uuid4().hex[:8]}"
    yield name
    for n in (name, f"{name}.dlq"):
        with contextlib.suppress(Exception):
            rabbitmq.delete(n)


def publish(url: str, queue: str, n: int, **kw) -> None:
    with ackkit.connect(url) as c:
        c.declare_queue(queue)
        for i in range(n):
            c.publish(queue, json.dumps({"i": i}), message_id=f"m{i}", **kw)


def wait_until(pred, timeout=10.0, interval=0.02):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(interval)
    return pred()


def test_reject_requeue_with_one_consumer_loops(rabbitmq, q):
    """basicReject(tag, requeue=true): the five messages come back forever (ready 0, unacked 5)."""
    publish(rabbitmq.url, q, 5)
    calls = Counter()
    app = App(rabbitmq.url)

    @app.listener(q, ack_mode=AckMode.MANUAL, consumer=Consumer(prefetch=10))
    def h(d: Delivery) -> None:
        calls[d.message_id] += 1
        time.sleep(0.002)
        d.reject(requeue=True)

    with app.running():
        assert wait_until(lambda: sum(calls.values()) > 50)
        c = rabbitmq.counts(q)
        assert (c.ready + c.unacked) == 5 and c.unacked >= 1
    assert set(calls) == {f"m{i}" for i in range(5)}
    rabbitmq.wait_for(q, ready=5, unacked=0)  # nothing lost: back in the queue after stop


def test_reject_without_requeue_is_dead_lettered_not_dropped(rabbitmq, q):
    """basicReject(tag, requeue=false): origin 0/0 like the seed; ackkit keeps them in the DLQ."""
    publish(rabbitmq.url, q, 5)
    app = App(rabbitmq.url)

    @app.listener(q, ack_mode=AckMode.MANUAL)
    def h(d: Delivery) -> None:
        d.reject(requeue=False)

    with app.running():
        rabbitmq.wait_for(q, ready=0, unacked=0)
        rabbitmq.wait_for(f"{q}.dlq", ready=5)


def test_reject_without_requeue_and_no_dead_letter_route_drops(rabbitmq, q):
    """With dead_letter=None the raw AMQP behaviour remains: 0/0, gone (the seed's table)."""
    publish(rabbitmq.url, q, 5)
    app = App(rabbitmq.url)
    seen = []

    @app.listener(q, ack_mode=AckMode.MANUAL, dead_letter=None)
    def h(d: Delivery) -> None:
        seen.append(d.message_id)
        d.reject(requeue=False)

    with app.running():
        rabbitmq.wait_for(q, ready=0, unacked=0)
    assert sorted(seen) == [f"m{i}" for i in range(5)]  # each printed once


def test_ack_drains(rabbitmq, q):
    publish(rabbitmq.url, q, 5)
    app = App(rabbitmq.url)
    seen = []

    @app.listener(q, ack_mode=AckMode.MANUAL)
    def h(d: Delivery) -> None:
        seen.append(d.message_id)
        d.ack()

    with app.running():
        rabbitmq.wait_for(q, ready=0, unacked=0)
    assert len(seen) == 5


def test_nack_multiple_every_fifth_settles_the_window(rabbitmq, q):
    """basicNack(tag, multiple=true, requeue=false) when deliveryTag % 5 == 0 (CLIENT mode)."""
    publish(rabbitmq.url, q, 10)
    app = App(rabbitmq.url)
    nacks = []

    @app.listener(q, ack_mode=AckMode.CLIENT, consumer=Consumer(prefetch=10))
    def h(d: Delivery) -> None:
        if d.delivery_tag % 5 == 0:
            nacks.append(d.delivery_tag)
            d.nack(multiple=True, requeue=False)

    with app.running():
        rabbitmq.wait_for(q, ready=0, unacked=0)
        rabbitmq.wait_for(f"{q}.dlq", ready=10)  # two windows of 5, each settled by one nack
    assert nacks == [5, 10]


def test_random_reject_requeue_converges(rabbitmq, q):
    """A listener rejecting 2/3 with requeue: each message comes back until acked; ends 0/0."""
    publish(rabbitmq.url, q, 6)
    rnd = random.Random(7)
    acked = Counter()
    app = App(rabbitmq.url)

    @app.listener(q, ack_mode=AckMode.MANUAL, consumer=Consumer(prefetch=6))
    def h(d: Delivery) -> None:
        if rnd.random() < 2 / 3:
            d.reject(requeue=True)
        else:
            acked[d.message_id] += 1
            d.ack()

    with app.running():
        rabbitmq.wait_for(q, ready=0, unacked=0, timeout=20)
    assert acked == Counter({f"m{i}": 1 for i in range(6)})


def test_pull_get_ack_and_reject_requeue(rabbitmq, q):
    publish(rabbitmq.url, q, 2)
    with ackkit.connect(rabbitmq.url) as conn:
        d = conn.get(q)
        assert d is not None and d.attempt == 1
        d.reject(requeue=True)
        rabbitmq.wait_for(q, ready=2, unacked=0)
        got = []
        while (d := conn.get(q)) is not None:
            got.append(d.message_id)
            d.ack()
        assert sorted(got) == ["m0", "m1"]
        assert conn.get(q) is None  # empty queue -> None
    rabbitmq.wait_for(q, ready=0, unacked=0)


def test_manual_forgotten_ack_is_dead_lettered_not_stuck(rabbitmq, q):
    publish(rabbitmq.url, q, 3)
    app = App(rabbitmq.url)

    @app.listener(q, ack_mode=AckMode.MANUAL, consumer=Consumer(prefetch=2))
    def h(d: Delivery) -> None:
        pass  # forgot to ack

    with app.running():
        rabbitmq.wait_for(q, ready=0, unacked=0)
        rabbitmq.wait_for(f"{q}.dlq", ready=3)
        assert app.stats()[f"{q}:h"]["unsettled"] == 3
    with ackkit.connect(rabbitmq.url) as conn:
        d = conn.get(f"{q}.dlq")
        assert d is not None
        assert d.headers["ackkit-reason"] == "handler returned without settling"
        d.reject(requeue=True)


def test_manual_forgotten_ack_requeue_default_is_configurable(rabbitmq, q):
    publish(rabbitmq.url, q, 1)
    app = App(rabbitmq.url)
    calls = []

    @app.listener(q, ack_mode=AckMode.MANUAL, on_unsettled=Unsettled.REQUEUE)
    def h(d: Delivery) -> None:
        calls.append(d.redelivered)
        if len(calls) > 1:
            d.ack()

    with app.running():
        rabbitmq.wait_for(q, ready=0, unacked=0)
    assert calls == [False, True]


def test_settle_twice_raises_and_the_channel_survives(rabbitmq, q):
    publish(rabbitmq.url, q, 2)
    app = App(rabbitmq.url)
    errors = []

    @app.listener(q, ack_mode=AckMode.MANUAL)
    def h(d: Delivery) -> None:
        d.ack()
        try:
            d.ack()
        except ackkit.errors.AlreadySettled as exc:
            errors.append(exc)

    with app.running():
        rabbitmq.wait_for(q, ready=0, unacked=0)
        assert len(errors) == 2
        assert rabbitmq.counts(q).consumers == 1  # channel still open


def test_out_of_order_completion_never_acks_an_unsettled_tag(rabbitmq, q):
    """8 worker threads finish in random order; a multiple-ack over an in-flight tag would ack
    a message whose handler is still running (and a later ack of it would close the channel)."""
    n = 400
    publish(rabbitmq.url, q, n)
    rnd = random.Random(1)
    lock = threading.Lock()
    done = Counter()
    app = App(rabbitmq.url)

    @app.listener(
        q,
        consumer=Consumer(
            prefetch=50, concurrency=8, flush=FlushPolicy(max_pending=10, interval=0.05)
        ),
    )
    def h(body: dict) -> None:
        time.sleep(rnd.random() * 0.01)
        with lock:
            done[body["i"]] += 1

    with app.running():
        rabbitmq.wait_for(q, ready=0, unacked=0, timeout=30)
        stats = app.stats()[f"{q}:h"]
        assert rabbitmq.counts(q).consumers == 1
    assert done == Counter({i: 1 for i in range(n)})
    assert stats["dropped_stale"] == 0 and stats["acked"] == n
    assert stats["ack_frames"] < n  # batched


def test_graceful_shutdown_flushes_pending_acks(rabbitmq, q):
    publish(rabbitmq.url, q, 20)
    app = App(rabbitmq.url)
    seen = []

    # Acks would only go out after 60 s or 1000 messages: only the shutdown flush sends them.
    @app.listener(
        q,
        consumer=Consumer(prefetch=100, flush=FlushPolicy(max_pending=1000, interval=60)),
    )
    def h(body: dict) -> None:
        seen.append(body["i"])

    with app.running():
        assert wait_until(lambda: len(seen) == 20)
        assert rabbitmq.counts(q).unacked == 20
    rabbitmq.wait_for(q, ready=0, unacked=0)


def test_shutdown_returns_unstarted_prefetched_deliveries(rabbitmq, q):
    publish(rabbitmq.url, q, 10)
    app = App(rabbitmq.url, shutdown_timeout=5)
    started = threading.Event()

    @app.listener(q, consumer=Consumer(prefetch=10))
    def h(body: dict) -> None:
        started.set()
        time.sleep(0.5)

    with app.running():
        assert started.wait(5)
        time.sleep(0.1)
    c = rabbitmq.wait_for(q, unacked=0)
    assert c.ready == 9  # one handled, nine returned without running


def test_reconnect_after_connections_are_closed(rabbitmq, q):
    app = App(rabbitmq.url)
    seen = set()

    @app.listener(q, consumer=Consumer(prefetch=20))
    def h(body: dict) -> None:
        seen.add(body["i"])

    with ackkit.connect(rabbitmq.url) as c:
        c.declare_queue(q)
    with app.running():
        publish(rabbitmq.url, q, 10)
        assert wait_until(lambda: len(seen) == 10)
        rabbitmq.close_connections("test: cut")
        assert wait_until(lambda: rabbitmq.counts(q).consumers == 1, timeout=20)
        with ackkit.connect(rabbitmq.url) as c:
            for i in range(10, 20):
                c.publish(q, json.dumps({"i": i}))
        assert wait_until(lambda: len(seen) == 20, timeout=20)
        rabbitmq.wait_for(q, ready=0, unacked=0, timeout=15)
        assert rabbitmq.counts(q).consumers == 1


@pytest.mark.parametrize("mode", [AckMode.DUPS_OK, AckMode.INDIVIDUAL, AckMode.TRANSACTED])
def test_jms_modes_drain(rabbitmq, q, mode):
    publish(rabbitmq.url, q, 30)
    app = App(rabbitmq.url)

    if mode is AckMode.INDIVIDUAL:

        @app.listener(q, ack_mode=mode, consumer=Consumer(prefetch=10))
        def h(d: Delivery) -> None:
            d.ack()
    else:

        @app.listener(q, ack_mode=mode, consumer=Consumer(prefetch=10))
        def h(body: dict) -> None:
            pass

    with app.running():
        rabbitmq.wait_for(q, ready=0, unacked=0, timeout=15)
        s = app.stats()[f"{q}:h"]
    assert s["acked"] == 30
    if mode is AckMode.INDIVIDUAL:
        assert s["ack_frames"] == 30


def test_transacted_failure_requeues_the_batch_and_dead_letters_the_culprit(rabbitmq, q):
    publish(rabbitmq.url, q, 3)
    app = App(rabbitmq.url)
    calls = Counter()

    @app.listener(q, ack_mode=AckMode.TRANSACTED, consumer=Consumer(prefetch=10))
    def h(body: dict) -> None:
        calls[body["i"]] += 1
        if body["i"] == 2:
            raise ValueError("bad")

    with app.running():
        rabbitmq.wait_for(q, ready=0, unacked=0, timeout=15)
        rabbitmq.wait_for(f"{q}.dlq", ready=1)
    assert calls[2] == 1
