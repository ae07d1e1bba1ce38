"""The runtimes send settle frames in the order the core decided them, driven with
fake channels: a straggler's single ack overtaken by the multiple-ack that covers
it is an unknown delivery tag to the broker."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from ackkit import App, AsyncApp, Consumer, Delivery, FlushPolicy
from ackkit._core.actions import Ack, Republish
from ackkit._core.step import Step
from tests.unit._fakes import RETRY3, Broker, FakeChannel


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
    from ackkit._sync.consumer import Consumer as SyncConsumer

    app = App("amqp://guest:guest@localhost:1/%2f")

    @app.listener(
        "q",
        retry=RETRY3,
        consumer=Consumer(flush=FlushPolicy(max_pending=2, interval=60.0)),
    )
    def handle(d: Delivery) -> None:
        if d.message_id == "m1":
            raise ValueError("fails")

    broker = Broker(range(1, 5))
    queued: list[Callable[[], None]] = []
    published: list[Republish] = []
    conn = SimpleNamespace(is_open=True, ioloop=SimpleNamespace(call_later=lambda _s, _fn: None))
    rt = SimpleNamespace(
        app=app,
        connection=conn,
        stopping=False,
        call_soon=queued.append,  # the I/O thread has not run them yet
        publisher=SimpleNamespace(publish=lambda c, gen, a: published.append(a)),
    )
    c = SyncConsumer(rt, app.specs[0], None)  # type: ignore[arg-type]
    c.copies = rt.publisher  # type: ignore[assignment]
    ch = FakeChannel(broker)
    c.channel = ch
    c.core.channel_opened()

    def deliver(tag: int) -> Delivery:
        method = SimpleNamespace(delivery_tag=tag, redelivered=False, exchange="", routing_key="q")
        props = SimpleNamespace(headers=None, message_id=f"m{tag}", content_type=None)
        c._on_message(ch, method, props, b"{}")
        c.inbox.hand_over()  # the I/O loop's read is dealt with
        return c.inbox.take(timeout=0)  # type: ignore[return-value]

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
    from ackkit._sync.consumer import Consumer as SyncConsumer

    app = App("amqp://guest:guest@localhost:1/%2f")

    @app.listener("q")
    def handle(d: Delivery) -> None: ...

    broker = Broker(range(1, 2))
    queued: list[Callable[[], None]] = []
    rt = SimpleNamespace(
        app=app, connection=SimpleNamespace(is_open=True), stopping=False, call_soon=queued.append
    )
    c = SyncConsumer(rt, app.specs[0], None)  # type: ignore[arg-type]
    c.channel = FakeChannel(broker)
    c.core.channel_opened()
    with c.lock:
        c.core.receive(1)
        c.send(Step(c.core.generation, [Ack(1)]))
    c.flush()
    queued[0]()
    assert broker.acked == [1]


def test_async_runtime_sends_frames_in_decision_order() -> None:
    """The same race on asyncio: a task's straggler ack waits for room in aiormq's write
    queue while a later task's multiple-ack goes out first."""
    from ackkit._async.consumer import AsyncConsumer

    app = AsyncApp("amqp://guest:guest@localhost:1/%2f")

    @app.listener(
        "q",
        retry=RETRY3,
        consumer=Consumer(flush=FlushPolicy(max_pending=2, interval=60.0)),
    )
    async def handle(d: Delivery) -> None: ...

    async def main() -> Broker:
        broker = Broker(range(1, 5))

        class SlowChannel(FakeChannel):
            async def basic_ack(self, tag: int, multiple: bool = False, wait: bool = True) -> None:  # type: ignore[override]
                await asyncio.sleep(self.delays.get(tag, 0.0))  # a full write queue
                self.broker.apply([Ack(tag, multiple)])

        rt = SimpleNamespace(app=app, publisher=SimpleNamespace(submit=lambda c, a, original: None))
        c = AsyncConsumer(rt, app.specs[0], None)  # type: ignore[arg-type]
        c.copies = rt.publisher  # type: ignore[assignment]
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
            tasks.append(asyncio.ensure_future(c.execute(acts)))

        _scenario(c, deliver, finish)
        acts = core.republished(token[0], True)
        assert acts == [Ack(4, multiple=True)]
        tasks.append(asyncio.ensure_future(c.execute(acts)))
        await asyncio.gather(*tasks)
        return broker

    broker = asyncio.run(main())
    assert broker.outstanding == set()
    assert sorted(broker.acked) == [1, 2, 3, 4]


def test_threads_deciding_concurrently_still_send_in_decision_order() -> None:
    """Several workers finishing at once: the outbox keeps the frames valid."""
    from ackkit._sync.consumer import Consumer as SyncConsumer

    app = App("amqp://guest:guest@localhost:1/%2f")

    @app.listener(
        "q",
        consumer=Consumer(prefetch=300, flush=FlushPolicy(max_pending=3, interval=0.0)),
    )
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
    c = SyncConsumer(rt, app.specs[0], None)  # type: ignore[arg-type]
    c.channel = FakeChannel(broker)
    c.core.channel_opened()
    ts = [c.core.receive(tag) for tag in range(1, n + 1)]

    def worker(k: int) -> None:
        for t in ts[k::4]:
            with c.lock:
                acts = c.core.finish(t)
                if acts:
                    c.send(acts)

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
        c.outbox.append(c.core.drain())
    c.flush()
    assert broker.outstanding == set()
