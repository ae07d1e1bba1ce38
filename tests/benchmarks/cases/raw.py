"""Raw client anchors: hand-written pika / aio-pika consumers and a confirmed publisher.

These are the reference points the ackkit cases are compared with (see the module
docstring of :mod:`tests.benchmarks.cases` for the case protocol).
"""

from __future__ import annotations

import asyncio
from typing import Any

import aio_pika
import pika
from aio_pika.abc import AbstractIncomingMessage
from pika.adapters.blocking_connection import BlockingChannel
from pika.spec import Basic, BasicProperties

from ..broker import body, check_published
from . import BODY_SIZE, CaseTimeout, Watchdog, case

PREFETCH = 1000
ACK_EVERY = 100
PUBLISH_BATCH = 1000


# -- pika (BlockingConnection) ---------------------------------------------------------


def _pika_consume(url: str, queue: str, n: int, *, auto_ack: bool, ack_every: int) -> None:
    """Consume ``n`` messages; ack each (``ack_every=1``) or multiple-ack every k."""
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        ch = connection.channel()
        if not auto_ack:
            ch.basic_qos(prefetch_count=PREFETCH)
        count = 0
        unacked = 0
        watchdog = Watchdog(n)
        failure: list[CaseTimeout] = []

        def on_message(
            channel: BlockingChannel,
            method: Basic.Deliver,
            properties: BasicProperties,
            body: bytes,
        ) -> None:
            nonlocal count, unacked
            count += 1
            if not auto_ack:
                unacked += 1
                if unacked >= ack_every or count == n:
                    channel.basic_ack(method.delivery_tag, multiple=ack_every > 1)
                    unacked = 0
            if count >= n:
                channel.stop_consuming()

        def check() -> None:
            if watchdog.stalled(count):
                failure.append(watchdog.error(count))
                ch.stop_consuming()
            else:
                connection.call_later(1.0, check)

        connection.call_later(1.0, check)
        ch.basic_consume(queue, on_message, auto_ack=auto_ack)
        ch.start_consuming()
        if failure:
            raise failure[0]
    finally:
        if connection.is_open:
            connection.close()


@case("pika.noack")
def pika_noack(url: str, queue: str, n: int) -> None:
    """pika BlockingConnection, basic_consume auto_ack=True."""
    _pika_consume(url, queue, n, auto_ack=True, ack_every=1)


@case("pika.each")
def pika_each(url: str, queue: str, n: int) -> None:
    """pika BlockingConnection, prefetch 1000, basic_ack per message."""
    _pika_consume(url, queue, n, auto_ack=False, ack_every=1)


@case("pika.batched")
def pika_batched(url: str, queue: str, n: int) -> None:
    """pika BlockingConnection, prefetch 1000, multiple-ack every 100 + final ack."""
    _pika_consume(url, queue, n, auto_ack=False, ack_every=ACK_EVERY)


# -- aio-pika --------------------------------------------------------------------------


async def _watch(watchdog: Watchdog, count: list[int], done: asyncio.Event) -> None:
    while not done.is_set():
        if watchdog.stalled(count[0]):
            raise watchdog.error(count[0])
        await asyncio.sleep(1.0)


async def _wait_done(done: asyncio.Event, watchdog: Watchdog, count: list[int]) -> None:
    """Wait for ``done``; raise CaseTimeout if the watchdog fires first."""
    watch = asyncio.ensure_future(_watch(watchdog, count, done))
    waiter = asyncio.ensure_future(done.wait())
    try:
        await asyncio.wait({watch, waiter}, return_when=asyncio.FIRST_COMPLETED)
        if watch.done():
            watch.result()
    finally:
        for task in (watch, waiter):
            task.cancel()
        await asyncio.gather(watch, waiter, return_exceptions=True)


async def _aiopika_consume(url: str, queue: str, n: int, ack_every: int) -> None:
    connection = await aio_pika.connect(url)
    try:
        ch = await connection.channel()
        await ch.set_qos(prefetch_count=PREFETCH)
        q = await ch.get_queue(queue, ensure=True)
        count = [0]
        done = asyncio.Event()

        async def on_message(message: AbstractIncomingMessage) -> None:
            count[0] += 1
            if ack_every == 1:
                await message.ack()
            elif count[0] % ack_every == 0 or count[0] == n:
                await message.ack(multiple=True)
            if count[0] >= n:
                done.set()

        tag = await q.consume(on_message)
        await _wait_done(done, Watchdog(n), count)
        await q.cancel(tag)
    finally:
        await connection.close()


@case("aiopika.each")
def aiopika_each(url: str, queue: str, n: int) -> None:
    """aio-pika queue.consume callback, prefetch 1000, message.ack() per message."""
    asyncio.run(_aiopika_consume(url, queue, n, ack_every=1))


@case("aiopika.batched")
def aiopika_batched(url: str, queue: str, n: int) -> None:
    """aio-pika queue.consume callback, prefetch 1000, ack(multiple=True) every 100."""
    asyncio.run(_aiopika_consume(url, queue, n, ack_every=ACK_EVERY))


# -- publishing ------------------------------------------------------------------------


async def _publish_confirmed(url: str, queue: str, n: int) -> None:
    payload = body(BODY_SIZE)
    connection = await aio_pika.connect(url)
    try:
        ch = await connection.channel(publisher_confirms=True)
        exchange = ch.default_exchange
        sent = 0
        while sent < n:
            batch = min(PUBLISH_BATCH, n - sent)
            await asyncio.wait_for(
                asyncio.gather(
                    *(
                        exchange.publish(
                            aio_pika.Message(
                                payload, delivery_mode=aio_pika.DeliveryMode.PERSISTENT
                            ),
                            routing_key=queue,
                        )
                        for _ in range(batch)
                    )
                ),
                timeout=60,
            )
            sent += batch
    finally:
        await connection.close()


@case("publish.confirm", prefill=False, check=check_published)
def publish_confirm(url: str, queue: str, n: int) -> None:
    """aio-pika confirmed publish into an empty queue, batches of 1000 awaited."""
    asyncio.run(_publish_confirmed(url, queue, n))


# -- AMQP 1.0 (python-qpid-proton; RabbitMQ 4.x) -----------------------------------------


def _proton_available() -> None:
    from . import CaseUnavailable

    try:
        import proton  # noqa: F401
    except ImportError as exc:
        raise CaseUnavailable(f"python-qpid-proton missing: {exc}") from None


@case("amqp10.raw", available=_proton_available, requires=("proton",))
def amqp10_raw(url: str, queue: str, n: int) -> dict[str, float] | None:
    """A lean proton consumer (RabbitMQ 4.x): receive, decode, accept each, credit
    topped up as deliveries are settled (window 1000), no framework around it."""
    import urllib.parse

    from proton import Delivery, Handler, Message
    from proton.reactor import Container

    from . import CaseUnavailable

    parts = urllib.parse.urlsplit(url)
    done = [0]
    watchdog = Watchdog(n)
    failure: list[BaseException] = []

    class Consume(Handler):
        def on_connection_remote_open(self, event: Any) -> None:
            ssn = event.connection.session()
            ssn.open()
            rcv = ssn.receiver(f"bench-{queue}")
            rcv.source.address = "/queues/" + urllib.parse.quote(queue, safe="")
            rcv.open()
            rcv.flow(PREFETCH)

        def on_delivery(self, event: Any) -> None:
            dlv = event.delivery
            if not dlv.readable or dlv.partial:
                return
            rcv = dlv.link
            msg = Message()
            msg.decode(rcv.recv(dlv.pending))
            rcv.advance()
            dlv.update(Delivery.ACCEPTED)
            dlv.settle()
            done[0] += 1
            if rcv.credit < PREFETCH // 2:
                rcv.flow(PREFETCH - rcv.credit)
            if done[0] >= n:
                event.connection.close()

        def on_transport_error(self, event: Any) -> None:
            cond = event.transport.condition
            failure.append(CaseUnavailable(f"no AMQP 1.0 here: {cond and cond.description}"))

        def on_timer_task(self, event: Any) -> None:
            if done[0] >= n:
                return
            if watchdog.stalled(done[0]):
                failure.append(watchdog.error(done[0]))
                event.container.stop()
                return
            event.container.schedule(1.0, self)

    handler = Consume()
    container = Container()
    container.connect(
        url=f"amqp://{parts.hostname}:{parts.port or 5672}",
        handler=handler,
        reconnect=False,
        user=urllib.parse.unquote(parts.username or "guest"),
        password=urllib.parse.unquote(parts.password or "guest"),
        allowed_mechs="PLAIN",
        allow_insecure_mechs=True,
    )
    container.schedule(1.0, handler)
    container.run()
    if failure:
        raise failure[0]
    return None
