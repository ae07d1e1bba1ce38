"""Regression tests for what the chaos suite (tests/chaos) found, without a broker.

Core decisions first; then the runtimes' carrying of them, driven with fake
channels (the order in which settle frames leave for the broker).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ackkit import AckMode, App, AsyncApp, Delivery, FlushPolicy, Retry, Stage
from ackkit._core import headers as H
from ackkit._core.actions import Ack, Action, Nack, Reject, Republish
from ackkit._core.brokers import V3
from ackkit._core.listener import ListenerCore
from ackkit._core.policy import ListenerPolicy

RETRY3 = Retry(max_attempts=3, initial_interval=0.2)


def core(**kw: Any) -> ListenerCore:
    kw.setdefault("name", "l")
    kw.setdefault("queue", "q")
    c = ListenerCore(ListenerPolicy(**kw), wallclock=lambda: 0.0, broker=V3)
    c.channel_opened()
    return c


class Broker:
    """What the broker does with settle frames of one channel, in the order they arrive."""

    def __init__(self, tags: range) -> None:
        self.outstanding = set(tags)
        self.acked: list[int] = []
        self.requeued: list[int] = []

    def apply(self, acts: list[Action]) -> None:
        for a in acts:
            if isinstance(a, Republish):
                continue
            assert isinstance(a, Ack | Nack | Reject)
            if a.tag not in self.outstanding:
                raise AssertionError(f"PRECONDITION_FAILED - unknown delivery tag {a.tag}")
            many = getattr(a, "multiple", False)
            done = sorted(t for t in self.outstanding if t <= a.tag) if many else [a.tag]
            self.outstanding -= set(done)
            if isinstance(a, Ack) or not a.requeue:
                self.acked += done
            else:
                self.requeued += done


# -- classic queues: crash redeliveries must add up --------------------------------------


def test_classic_redelivery_goes_back_as_a_copy_that_carries_its_attempt() -> None:
    """The redelivered flag is yes/no: a message that kept killing its consumer came back
    as attempt 2 forever (the chaos run's slow message looped for minutes). Now the
    redelivery is republished to its queue stamped with its attempt, then acked."""
    c = core(retry=RETRY3)
    t = c.receive(1, redelivered=True, headers={}, exchange="ex", routing_key="rk")
    assert t.attempt == 2
    [a] = t.verdict or []
    assert isinstance(a, Republish)
    assert (a.exchange, a.routing_key, a.purpose) == ("", "q", "restamp")
    assert a.set_headers[H.ATTEMPT] == 2
    assert a.set_headers[H.X_DELIVERY_COUNT] is None
    assert a.set_headers[H.ORIGINAL_EXCHANGE] == "ex"
    assert a.set_headers[H.ORIGINAL_ROUTING_KEY] == "rk"
    assert c.republished(a.token, True) == [Ack(1)]  # the original goes once the copy is safe


def test_a_message_that_always_kills_its_consumer_reaches_the_dlq_after_max_attempts() -> None:
    """Deliver, lose the consumer, redeliver ... on a classic queue: the handler runs
    exactly max_attempts times, then the redelivery goes to the DLQ without running."""
    headers: dict[str, Any] = {}
    redelivered = False
    runs = 0
    for _ in range(10):
        c = core(retry=RETRY3)  # a new consumer each time
        t = c.receive(1, redelivered=redelivered, headers=headers)
        if t.verdict is None:
            runs += 1  # the handler runs ... and the consumer dies: redelivered
            redelivered = True
            continue
        [a] = t.verdict
        assert isinstance(a, Republish)
        if a.purpose == "dead-letter":
            assert a.set_headers[H.REASON] == "attempts exhausted (3 of 3, last one lost)"
            break
        assert a.purpose == "restamp"
        headers = {k: v for k, v in a.set_headers.items() if v is not None}
        redelivered = False  # the copy is a new message
    else:
        raise AssertionError("the message looped")
    assert runs == 3


@pytest.mark.parametrize(
    ("retry", "headers", "queue_type"),
    [
        # a quorum queue counts its deliveries itself
        (RETRY3, {H.X_DELIVERY_COUNT: 1}, "quorum"),
        # no retries: a crash redelivery is simply handled again
        (Retry(max_attempts=1), {}, None),
    ],
)
def test_no_restamp_when_the_broker_counts_or_nothing_is_counted(
    retry: Retry, headers: dict[str, Any], queue_type: str | None
) -> None:
    c = core(retry=retry, queue_type=queue_type)
    t = c.receive(1, redelivered=True, headers=headers)
    assert t.verdict is None and t.attempt == 2


@pytest.mark.parametrize("queue_type", [None, "classic", "stream"])
@pytest.mark.parametrize("forged", [0, 1, 2, "1", 999])
def test_a_producers_delivery_count_never_stops_the_counting(
    queue_type: str | None, forged: object
) -> None:
    """Where the broker does not maintain x-delivery-count, a producer's value is
    ignored: every redelivery is restamped with one more attempt until the DLQ."""
    c = core(retry=RETRY3, queue_type=queue_type)
    headers: dict[str, Any] = {H.X_DELIVERY_COUNT: forged}
    first = c.receive(1, redelivered=False, headers=headers)
    assert first.verdict is None and first.attempt == 1
    tag, seen = 2, []
    for _ in range(10):
        t = c.receive(tag, redelivered=True, headers=headers)
        tag += 1
        [a] = t.verdict or []
        seen.append(a.purpose)
        if a.purpose == "dead-letter":
            break
        headers = {**headers, **{k: v for k, v in a.set_headers.items() if v is not None}}
    assert seen == ["restamp", "restamp", "dead-letter"]


def test_restamp_keeps_the_first_origin_of_a_retried_copy() -> None:
    c = core(retry=RETRY3)
    old = {H.ATTEMPT: 2, H.ORIGINAL_EXCHANGE: "orders", H.ORIGINAL_ROUTING_KEY: "new"}
    t = c.receive(7, redelivered=True, headers=old, exchange="", routing_key="q")
    [a] = t.verdict or []
    assert isinstance(a, Republish) and a.set_headers[H.ATTEMPT] == 3
    assert H.ORIGINAL_EXCHANGE not in a.set_headers  # merged into the copy's headers as-is


# -- a copy of a delivery whose channel closed is not published --------------------------


def test_copy_of_a_delivery_from_a_closed_channel_is_not_publishable() -> None:
    """A retry copy decided before a connection loss and published after it was a second
    lineage next to the broker's redelivery of the original (over-attempts, DLQ twins)."""
    c = core(retry=RETRY3)
    t = c.receive(1)
    [a] = c.finish(t, ValueError("x"))
    assert isinstance(a, Republish) and c.publishable(a.token)
    c.channel_closed()
    assert not c.publishable(a.token)
    c.channel_opened()
    assert not c.publishable(a.token)
    assert c.republished(a.token, False) == []  # no requeue of a stale tag either
    assert not c.publishable(a.token)  # forgotten


def test_no_ack_copy_is_always_publishable() -> None:
    c = core(mode=AckMode.NONE)
    t = c.receive(1)
    [a] = c.finish(t, ValueError("x"))
    c.channel_closed()
    assert c.publishable(a.token)  # the broker forgot the original: the copy is all there is


# -- the original is acked at once when its copy is confirmed ----------------------------


def test_confirmed_copy_acks_the_original_at_once() -> None:
    c = core(retry=RETRY3, prefetch=100)
    ts = [c.receive(n) for n in (1, 2, 3)]
    assert c.finish(ts[1]) == []  # batched
    [a] = c.finish(ts[0], ValueError("x"))
    assert isinstance(a, Republish)
    # 1 and 2 form the settled prefix now: one multiple-ack, no waiting for the flush
    assert c.republished(a.token, True) == [Ack(2, multiple=True)]
    [b] = c.finish(ts[2], ValueError("y"))
    assert c.republished(b.token, True) == [Ack(3)]
    assert c.drain() == []


def test_confirmed_copy_behind_a_running_handler_is_acked_alone() -> None:
    c = core(retry=RETRY3, prefetch=100)
    ts = [c.receive(n) for n in (1, 2, 3)]
    [a] = c.finish(ts[1], ValueError("x"))
    assert c.republished(a.token, True) == [Ack(2)]  # 1 still in its handler
    assert c.finish(ts[0]) == [] and c.finish(ts[2]) == []
    assert c.drain() == [Ack(3, multiple=True)]


def test_transacted_keeps_the_ack_in_the_transaction() -> None:
    c = core(retry=RETRY3, mode=AckMode.TRANSACTED, prefetch=100)
    t = c.receive(1)
    [a] = c.finish(t, ValueError("x"))
    assert c.republished(a.token, True) == []


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 3), st.integers(0, 39)), min_size=1, max_size=120),
    st.integers(1, 12),
)
def test_any_interleaving_of_finishes_confirms_and_flushes_is_valid(
    ops: list[tuple[int, int]], max_pending: int
) -> None:
    """In decision order, every frame names an outstanding tag and every delivery ends
    settled exactly once (acks: handled or copied; requeues: refused copies)."""
    n = 40
    c = core(
        retry=RETRY3,
        prefetch=100,
        flush=FlushPolicy(max_pending=max_pending, interval=0.0),
    )
    broker = Broker(range(1, n + 1))
    ts = [c.receive(tag) for tag in range(1, n + 1)]
    tokens: list[int] = []
    for op, i in ops:
        if op == 0 and not ts[i].settled:
            broker.apply(c.finish(ts[i]))
        elif op == 1 and not ts[i].settled:
            acts = c.finish(ts[i], ValueError("x"))
            tokens += [a.token for a in acts if isinstance(a, Republish)]
            broker.apply(acts)
        elif op == 2 and tokens:
            broker.apply(c.republished(tokens.pop(i % len(tokens)), i % 5 != 0))
        else:
            broker.apply(c.tick())
    for t in ts:
        if not t.settled:
            broker.apply(c.finish(t))
    for tok in tokens:
        broker.apply(c.republished(tok, True))
    broker.apply(c.drain())
    assert broker.outstanding == set()
    assert sorted(broker.acked + broker.requeued) == list(range(1, n + 1))


# -- runtimes: frames leave in decision order --------------------------------------------


class FakeChannel:
    def __init__(self, broker: Broker, delays: dict[int, float] | None = None) -> None:
        self.broker = broker
        self.delays = delays or {}
        self.is_open = True
        self.is_closed = False
        self.channel_number = 1

    def basic_ack(self, tag: int, multiple: bool = False) -> None:
        self.broker.apply([Ack(tag, multiple)])

    def basic_reject(self, tag: int, requeue: bool = False) -> None:
        self.broker.apply([Reject(tag, requeue)])

    def basic_nack(self, tag: int, multiple: bool = False, requeue: bool = True) -> None:
        self.broker.apply([Nack(tag, multiple, requeue)])


def _scenario(c: Any, deliver: Callable[[int], Any], finish: Callable[[Any, bool], None]) -> Any:
    """1 fails (its copy is published), 2 and 3 are acked as stragglers behind it (the
    window holds 2 pending acks at most), 4 succeeds; then 1's copy is confirmed: its
    ack is a multiple-ack over 1..4, decided after the stragglers' single acks."""
    ds = [deliver(tag) for tag in (1, 2, 3, 4)]
    finish(ds[0], True)
    finish(ds[1], False)
    finish(ds[2], False)  # decides [Ack(2), Ack(3)]
    finish(ds[3], False)
    return ds


def test_sync_runtime_sends_frames_in_decision_order() -> None:
    """A worker's straggler acks were handed to the I/O thread with call_soon after the
    worker let go of the lock; the I/O thread's own decisions (a confirm's multiple-ack)
    ran at once and overtook them: unknown delivery tag, the channel closed (chaos run)."""
    from ackkit._sync.consumer import Consumer

    app = App("amqp://guest:guest@localhost:1/%2f")

    @app.listener("q", retry=RETRY3, flush=FlushPolicy(max_pending=2, interval=60.0))
    def handle(d: Delivery) -> None:
        if d.message_id == "m1":
            raise ValueError("fails")

    broker = Broker(range(1, 5))
    queued: list[Callable[[], None]] = []
    published: list[Republish] = []
    conn = SimpleNamespace(is_open=True)
    rt = SimpleNamespace(
        app=app,
        connection=conn,
        stopping=False,
        call_soon=queued.append,  # the I/O thread has not run them yet
        publisher=SimpleNamespace(publish=lambda c, gen, a: published.append(a)),
    )
    c = Consumer(rt, app.specs[0], None)  # type: ignore[arg-type]
    ch = FakeChannel(broker)
    c.channel = ch
    c.core.channel_opened()

    def deliver(tag: int) -> Delivery:
        method = SimpleNamespace(delivery_tag=tag, redelivered=False, exchange="", routing_key="q")
        props = SimpleNamespace(headers=None, message_id=f"m{tag}", content_type=None)
        c._on_message(ch, method, props, b"{}")
        return c.inbox.get_nowait()  # type: ignore[no-any-return]

    def finish(d: Delivery, _fails: bool) -> None:
        c._run([d])  # what a worker thread does

    _scenario(c, deliver, finish)
    queued.pop(0)()  # the I/O thread publishes 1's copy ...
    assert [p.tag for p in published] == [1]
    # ... and its confirm arrives before the I/O thread got to the workers' later callbacks
    c.republished(c.core.generation, published[0].token, True)
    for fn in queued:
        fn()
    assert broker.outstanding == set()
    assert sorted(broker.acked) == [1, 2, 3, 4]


def test_sync_runtime_ignores_a_queued_callback_after_the_flush() -> None:
    """A worker's call_soon that runs after the I/O thread already flushed finds nothing."""
    from ackkit._sync.consumer import Consumer

    app = App("amqp://guest:guest@localhost:1/%2f")

    @app.listener("q")
    def handle(d: Delivery) -> None: ...

    broker = Broker(range(1, 2))
    queued: list[Callable[[], None]] = []
    rt = SimpleNamespace(
        app=app, connection=SimpleNamespace(is_open=True), stopping=False, call_soon=queued.append
    )
    c = Consumer(rt, app.specs[0], None)  # type: ignore[arg-type]
    c.channel = FakeChannel(broker)
    c.core.channel_opened()
    with c.lock:
        c.core.receive(1)
        c.send(c.core.generation, [Ack(1)])
    c.flush()
    queued[0]()
    assert broker.acked == [1]


def test_async_runtime_sends_frames_in_decision_order() -> None:
    """The same race on asyncio: a task's straggler ack waits for room in aiormq's write
    queue while a later task's multiple-ack goes out first."""
    from ackkit._async.consumer import AsyncConsumer

    app = AsyncApp("amqp://guest:guest@localhost:1/%2f")

    @app.listener("q", retry=RETRY3, flush=FlushPolicy(max_pending=2, interval=60.0))
    async def handle(d: Delivery) -> None: ...

    async def main() -> Broker:
        broker = Broker(range(1, 5))

        class SlowChannel(FakeChannel):
            async def basic_ack(self, tag: int, multiple: bool = False, wait: bool = True) -> None:  # type: ignore[override]
                await asyncio.sleep(self.delays.get(tag, 0.0))  # a full write queue
                self.broker.apply([Ack(tag, multiple)])

        rt = SimpleNamespace(app=app, publisher=SimpleNamespace(submit=lambda c, a: None))
        c = AsyncConsumer(rt, app.specs[0], None)  # type: ignore[arg-type]
        c.channel = SlowChannel(broker, {2: 0.05})  # type: ignore[assignment]
        core = c.core
        core.channel_opened()
        tasks: list[asyncio.Task[None]] = []
        token: list[int] = []

        def deliver(tag: int) -> Any:
            return core.receive(tag)

        def finish(t: Any, fails: bool) -> None:
            acts = core.finish(t, ValueError("x") if fails else None)
            token.extend(a.token for a in acts if isinstance(a, Republish))
            tasks.append(asyncio.ensure_future(c.execute(core.generation, acts)))

        _scenario(c, deliver, finish)
        acts = core.republished(token[0], True)
        assert acts == [Ack(4, multiple=True)]
        tasks.append(asyncio.ensure_future(c.execute(core.generation, acts)))
        await asyncio.gather(*tasks)
        return broker

    broker = asyncio.run(main())
    assert broker.outstanding == set()
    assert sorted(broker.acked) == [1, 2, 3, 4]


def test_sync_publisher_drops_a_waiting_copy_of_a_closed_channel() -> None:
    """Copies waiting for the publisher channel are dropped if their delivery's channel
    closed meanwhile (they used to be published on the next connection: duplicates)."""
    from ackkit._sync.consumer import Consumer
    from ackkit._sync.publisher import Publisher

    app = App("amqp://guest:guest@localhost:1/%2f")

    @app.listener("q", retry=RETRY3)
    def handle(d: Delivery) -> None:
        raise ValueError("x")

    rt: Any = SimpleNamespace(
        app=app, connection=SimpleNamespace(is_open=True), stopping=False, call_soon=lambda f: f()
    )
    rt.publisher = pub = Publisher(rt)
    c = Consumer(rt, app.specs[0], None)
    c.channel = FakeChannel(Broker(range(1, 2)))
    c.core.channel_opened()
    t = c.core.receive(1)
    [a] = c.core.finish(t, ValueError("x"))
    assert isinstance(a, Republish)
    pub.publish(c, c.core.generation, a)  # no publisher channel yet: waits
    assert len(pub.waiting) == 1
    c.core.channel_closed()
    c.core.channel_opened()
    sent: list[Any] = []
    ch = SimpleNamespace(is_open=True, basic_publish=lambda *args, **kw: sent.append(args))
    pub._ready(ch)
    assert sent == [] and pub.pending == {}


def test_sync_publisher_closing_with_its_connection_does_not_settle_stale_tags() -> None:
    """pika closes a connection's channels in number order, the publisher's first: the
    unconfirmed copies were reported before the consumers' channels were marked closed,
    and the requeue of their originals went to a dead connection (ConnectionWrongStateError
    in the I/O thread: the consumer process exited on every connection cut)."""
    from ackkit._sync.consumer import Consumer
    from ackkit._sync.publisher import Publisher

    app = App("amqp://guest:guest@localhost:1/%2f")

    @app.listener("q", retry=RETRY3)
    def handle(d: Delivery) -> None: ...

    conn = SimpleNamespace(is_open=True, ioloop=SimpleNamespace(call_later=lambda *a: None))
    rt: Any = SimpleNamespace(app=app, connection=conn, stopping=False, call_soon=lambda f: f())
    rt.publisher = pub = Publisher(rt)
    c = Consumer(rt, app.specs[0], None)
    rt.consumers = [c]

    def channels_lost(reason: BaseException) -> None:
        for x in rt.consumers:
            if x.channel is not None:
                x._on_channel_closed(x.channel, reason)

    rt.channels_lost = channels_lost

    class DeadChannel(FakeChannel):
        def basic_reject(self, tag: int, requeue: bool = False) -> None:
            raise AssertionError("a frame on a closed connection")

    c.channel = DeadChannel(Broker(range(1, 2)))
    c.core.channel_opened()
    t = c.core.receive(1)
    Delivery(b"{}", SimpleNamespace(headers=None, message_id="m1"), t, c)
    [a] = c.core.finish(t, ValueError("x"))
    pub.channel = SimpleNamespace(is_open=True, basic_publish=lambda *args, **kw: None)
    pub.publish(c, c.core.generation, a)
    assert len(pub.pending) == 1
    conn.is_open = False  # the connection is going down
    pub._on_closed(pub.channel, ConnectionError("cut"))
    assert c.channel is None and not c.core.open
    assert pub.pending == {}


def test_threads_deciding_concurrently_still_send_in_decision_order() -> None:
    """Several workers finishing at once: the outbox keeps the frames valid."""
    from ackkit._sync.consumer import Consumer

    app = App("amqp://guest:guest@localhost:1/%2f")

    @app.listener("q", prefetch=300, flush=FlushPolicy(max_pending=3, interval=0.0))
    def handle(d: Delivery) -> None: ...

    n = 300
    broker = Broker(range(1, n + 1))
    queued: list[Callable[[], None]] = []
    lock = threading.Lock()

    def call_soon(fn: Callable[[], None]) -> None:
        with lock:
            queued.append(fn)

    rt = SimpleNamespace(
        app=app, connection=SimpleNamespace(is_open=True), stopping=False, call_soon=call_soon
    )
    c = Consumer(rt, app.specs[0], None)  # type: ignore[arg-type]
    c.channel = FakeChannel(broker)
    c.core.channel_opened()
    ts = [c.core.receive(tag) for tag in range(1, n + 1)]

    def worker(k: int) -> None:
        for t in ts[k::4]:
            with c.lock:
                acts = c.core.finish(t)
                if acts:
                    c.send(c.core.generation, acts)

    def io_thread(stop: threading.Event) -> None:
        while not stop.is_set():
            c.tick()
            with lock:
                todo, queued[:] = list(queued), []
            for fn in todo:
                fn()

    stop = threading.Event()
    io = threading.Thread(target=io_thread, args=(stop,))
    io.start()
    workers = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    stop.set()
    io.join()
    with c.lock:
        c.outbox.append((c.core.generation, c.core.drain()))
    c.flush()
    assert broker.outstanding == set()


# -- retry copies of a quorum queue survive a broker restart -----------------------------


def test_a_quorum_origin_gets_quorum_delay_queues_that_dead_letter_at_least_once() -> None:
    """A classic delay queue dead-letters at-most-once: the copies waiting in it when the
    broker restarted never reached the quorum origin queue again (lost, chaos run)."""
    app = App("amqp://guest:guest@localhost:1/%2f")

    @app.listener("q", retry=RETRY3, queue_arguments={"x-queue-type": "quorum"})
    def handle(d: Delivery) -> None: ...

    policy = app.specs[0].policy
    assert policy.queue_type == "quorum"
    delays = [s for s in ListenerCore(policy).topology() if s.purpose == "retry-delay"]
    assert delays
    for spec in delays:
        assert spec.arguments["x-queue-type"] == "quorum"
        assert spec.arguments["x-dead-letter-strategy"] == "at-least-once"
        assert spec.arguments["x-overflow"] == "reject-publish"
        assert spec.arguments["x-dead-letter-routing-key"] == "q"
    c = ListenerCore(policy)
    assert c.extra_delay_queue(7.5) is not None
    assert c.extra_delay_queue(7.5).arguments["x-queue-type"] == "quorum"  # type: ignore[union-attr]
    classic = [s for s in core(retry=RETRY3).topology() if s.purpose == "retry-delay"]
    assert all("x-queue-type" not in s.arguments for s in classic)  # unchanged


# -- a delivery whose channel closed while it waited is not handled ----------------------


def test_a_delivery_of_a_closed_channel_does_not_start() -> None:
    """The broker requeued it with its channel: running the handler now only duplicated
    the work its redelivery does (the pika runtime ran its whole inbox after every cut)."""
    c = core(retry=RETRY3)
    t = c.receive(1)
    assert c.startable(t)
    c.channel_closed()
    c.channel_opened()
    assert not c.startable(t) and t.settled
    assert c.counters.counts[Stage.DROPPED_STALE] == 1
    n = core(mode=AckMode.NONE)
    u = n.receive(1)
    n.channel_closed()
    assert n.startable(u)  # no-ack: the broker forgot it, this is the only chance


def test_sync_worker_skips_deliveries_of_a_closed_channel() -> None:
    from ackkit._sync.consumer import Consumer

    app = App("amqp://guest:guest@localhost:1/%2f")
    ran: list[int] = []

    @app.listener("q")
    def handle(d: Delivery) -> None:
        ran.append(d.delivery_tag)

    rt = SimpleNamespace(
        app=app,
        connection=SimpleNamespace(is_open=True),
        stopping=False,
        call_soon=lambda fn: None,
    )
    c = Consumer(rt, app.specs[0], None)  # type: ignore[arg-type]
    ch = FakeChannel(Broker(range(1, 3)))
    c.channel = ch
    c.core.channel_opened()
    for tag in (1, 2):
        method = SimpleNamespace(delivery_tag=tag, redelivered=False, exchange="", routing_key="q")
        c._on_message(ch, method, SimpleNamespace(headers=None, message_id=None), b"{}")
    c.core.channel_closed()  # both still in the inbox
    c.core.channel_opened()
    c.inbox.put(None)
    c._worker()
    assert ran == []
    assert c.core.counters.counts[Stage.DROPPED_STALE] == 2
