"""AsyncApp: a settle waiting for room in the write queue of a connection that died
(the broker restarted) is given up when its channel closes. aiormq's write queue holds
10 frames and only the connection's writer makes room; before, the wait never ended and
held the listener's settling lock: every later settle of the listener, on its new
channel too, and the runtime's tick waited behind it, and the listener, its prefetch
full of finished deliveries never acked, consumed nothing more (the inbox crash test
with a broker restart, on AsyncApp)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from ackkit import AsyncApp, Consumer, Delivery, FlushPolicy
from ackkit._core.actions import Ack
from tests.unit._fakes import Broker, FakeChannel


class LiveChannel(FakeChannel):
    async def basic_ack(self, tag: int, multiple: bool = False, wait: bool = True) -> None:  # type: ignore[override]
        self.broker.apply([Ack(tag, multiple)])


class DeadConnectionChannel(FakeChannel):
    """An aiormq-like channel whose connection's write queue is full and never drained."""

    def __init__(self, broker: Broker) -> None:
        super().__init__(broker)
        self.connection = SimpleNamespace(write_queue=asyncio.Queue(maxsize=1))
        self.connection.write_queue.put_nowait("a frame the dead writer never took")
        self._closing: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    @property
    def closing(self) -> asyncio.Future[None]:
        observer: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def relay(f: asyncio.Future[None]) -> None:
            if not observer.done():
                observer.set_exception(ConnectionError("connection lost"))

        self._closing.add_done_callback(relay)
        return observer

    def lose(self) -> None:
        self.is_closed, self.is_open = True, False
        self._closing.set_result(None)

    async def basic_ack(self, tag: int, multiple: bool = False, wait: bool = True) -> None:  # type: ignore[override]
        await self.connection.write_queue.put(("ack", tag))  # waits for room, as aiormq
        self.broker.apply([Ack(tag, multiple)])


def test_a_settle_stuck_on_a_dead_connection_is_given_up_when_its_channel_closes() -> None:
    app = AsyncApp("amqp://guest:guest@localhost:1/%2f")

    @app.listener("q", consumer=Consumer(flush=FlushPolicy(max_pending=1, interval=60.0)))
    async def handle(d: Delivery) -> None: ...

    async def main() -> tuple[bool, bool, list[int]]:
        from ackkit._async.consumer import AsyncConsumer

        broker = Broker(range(1, 3))
        rt: Any = SimpleNamespace(app=app, publisher=SimpleNamespace(submit=lambda *a: None))
        c = AsyncConsumer(rt, app.specs[0], None)
        c.copies = rt.publisher
        ch = DeadConnectionChannel(broker)
        c.channel = ch  # type: ignore[assignment]
        core = c.core
        core.channel_opened()
        t = core.receive(1)
        stuck = asyncio.ensure_future(c.execute(core.finish(t, None)))
        await asyncio.sleep(0.05)
        waited = not stuck.done()  # for room in the write queue
        ch.lose()  # the broker restarted: the channel closes, the queue stays full
        try:
            await asyncio.wait_for(asyncio.shield(stuck), 2.0)
        except TimeoutError:
            return waited, False, []
        # the listener's next channel settles again (the lock is free)
        core.channel_closed()
        c.channel = LiveChannel(broker)  # type: ignore[assignment]
        core.channel_opened()
        t2 = core.receive(2)
        await asyncio.wait_for(c.execute(core.finish(t2, None)), 2.0)
        return waited, True, list(broker.acked)

    waited, given_up, acked = asyncio.run(main())
    assert waited
    assert given_up, "the settle waited for ever on the dead connection's write queue"
    assert acked == [2]
