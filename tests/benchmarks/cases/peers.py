"""Peer libraries with their defaults: FastStream and kombu.

Each peer is used the way its documentation shows a basic consumer, with its default
acknowledgement, prefetch and logging settings; only a message counter is added so
the case can stop after ``n`` messages. Heavy imports happen inside the functions but
are listed in ``requires``, so the worker imports them before the clock starts.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from . import Watchdog, case


async def _faststream(url: str, queue: str, n: int) -> None:
    from faststream.rabbit import RabbitBroker, RabbitQueue

    broker = RabbitBroker(url)
    count = [0]
    done = asyncio.Event()

    # declare=False: the harness declared the queue already (durable classic).
    @broker.subscriber(RabbitQueue(queue, durable=True, declare=False))
    async def handle(body: bytes) -> None:
        count[0] += 1
        if count[0] >= n:
            done.set()

    watchdog = Watchdog(n)
    await broker.start()
    try:
        while not done.is_set():
            if watchdog.stalled(count[0]):
                raise watchdog.error(count[0])
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(done.wait(), timeout=1.0)
        # The default ack policy acks right after the handler returns; let the
        # consumer task finish that last ack before the broker is stopped.
        for _ in range(10):
            await asyncio.sleep(0)
    finally:
        await broker.stop()


@case("faststream.default", requires=("faststream.rabbit",))
def faststream_default(url: str, queue: str, n: int) -> None:
    """FastStream RabbitBroker subscriber, no-op async handler, all defaults."""
    asyncio.run(_faststream(url, queue, n))


@case("kombu.default", requires=("kombu", "amqp"))
def kombu_default(url: str, queue: str, n: int) -> None:
    """kombu Consumer, callback calls message.ack(), default prefetch (none set)."""
    import kombu

    k: Any = kombu  # kombu's annotations are partial; treat it as untyped

    count = 0

    def on_message(body: Any, message: Any) -> None:
        nonlocal count
        message.ack()
        count += 1

    watchdog = Watchdog(n)
    # no_declare: the harness declared the queue already (durable classic).
    with (
        k.Connection(url) as conn,
        k.Consumer(conn, queues=[k.Queue(queue, no_declare=True)], callbacks=[on_message]),
    ):
        while count < n:
            try:
                conn.drain_events(timeout=1.0)
            except TimeoutError:
                if watchdog.stalled(count):
                    raise watchdog.error(count) from None
