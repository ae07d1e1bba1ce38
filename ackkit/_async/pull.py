"""Pull mode on asyncio: basic.get one message at a time, settled on its own channel."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import aio_pika
from aiormq.abc import AbstractChannel, AbstractConnection
from pamqp import commands as spec

from .._core.actions import Action, Republish
from .._core.listener import ListenerCore
from .._core.policy import DLQ_DEFAULT, AckMode, FlushPolicy, ListenerPolicy
from .._delivery import Delivery
from .._runtime_common import publish_properties
from .._tls import TLS, client_tls
from .._url import mask_url
from ._amqp import ChannelNumbers, declare_queues, open_connection, publish_copy, send_settles
from .delivery import AsyncDelivery


class AsyncPullConnection:
    """An asyncio connection for basic.get and publishing (tests, scripts, tools).

    Use `async with ackkit.aconnect(url) as conn:`. Each queue gets a MANUAL
    listener core: `await d.ack()` / `nack()` / `reject()` settle exactly once,
    reject/nack without requeue dead-letter to `<queue>.dlq`, and a delivery
    fetched on a channel that has since closed is never settled on its
    successor.
    """

    def __init__(
        self, url: str, *, heartbeat: int = 30, tls: TLS | ssl.SSLContext | None = None
    ) -> None:
        self.url = url
        self._tls = client_tls(url, tls)
        self.heartbeat = heartbeat
        self._conn: aio_pika.abc.AbstractConnection | None = None
        self._amqp: AbstractConnection | None = None
        self._ch: AbstractChannel | None = None
        self._numbers = ChannelNumbers()
        self._cores: dict[str, ListenerCore] = {}
        self._lock = asyncio.Lock()

    def __repr__(self) -> str:
        return f"<AsyncPullConnection {mask_url(self.url)}>"

    async def open(self) -> AsyncPullConnection:
        await self._channel()
        return self

    async def _channel(self) -> AbstractChannel:
        if self._amqp is None or self._amqp.is_closed:
            self._conn, self._amqp = await open_connection(
                self.url, heartbeat=self.heartbeat, name="ackkit-pull", timeout=10.0, tls=self._tls
            )
            self._numbers = ChannelNumbers()
            self._ch = None
        if self._ch is None or self._ch.is_closed:
            self._ch = await self._amqp.channel(self._numbers.take(), publisher_confirms=True)
            for core in self._cores.values():
                core.channel_closed()
                core.channel_opened()
        return self._ch

    async def _core(self, queue: str, dead_letter: str | None) -> ListenerCore:
        core = self._cores.get(queue)
        if core is None:
            policy = ListenerPolicy(
                name=f"pull:{queue}",
                queue=queue,
                mode=AckMode.MANUAL,
                prefetch=0,
                dead_letter=dead_letter,
                flush=FlushPolicy(max_pending=1, interval=0.0),
            )
            core = ListenerCore(policy)
            await self._channel()
            assert self._amqp is not None
            core.channel_opened()
            await declare_queues(self._amqp, self._numbers, core.topology())
            self._cores[queue] = core
        return core

    async def get(
        self, queue: str, *, dead_letter: str | None = DLQ_DEFAULT
    ) -> AsyncDelivery | None:
        """basic.get with manual ack: an AsyncDelivery to settle, or None if the queue is empty."""
        async with self._lock:
            core = await self._core(queue, dead_letter)
            while True:
                ch = await self._channel()
                msg = await ch.basic_get(queue, no_ack=False)
                dv = msg.delivery
                if not isinstance(dv, spec.Basic.GetOk) or dv.delivery_tag is None:
                    return None
                props = msg.header.properties
                exchange = dv.exchange or ""
                rk = dv.routing_key or ""
                t = core.receive(dv.delivery_tag, bool(dv.redelivered), props.headers, exchange, rk)
                d = AsyncDelivery(
                    msg.body,
                    props,
                    t,
                    self,
                    exchange=exchange,
                    routing_key=rk,
                    redelivered=bool(dv.redelivered),
                    queue=queue,
                )
                if t.verdict is None:
                    return d
                await self._execute(core, ch, t.verdict)  # e.g. a forged attempt header

    async def asettle(self, delivery: Delivery, kind: str, requeue: bool, multiple: bool) -> None:
        """AsyncSettler protocol: carry out `await d.ack()` / nack / reject."""
        async with self._lock:
            core = self._cores[delivery.queue]
            acts = core.settle(delivery.tracked, kind, requeue=requeue, multiple=multiple)
            ch = self._ch
            if acts and ch is not None:
                await self._execute(core, ch, acts)

    def settle(self, delivery: Delivery, kind: str, requeue: bool, multiple: bool) -> None:
        raise RuntimeError("AsyncPullConnection deliveries settle with `await delivery.ack()`")

    async def _execute(self, core: ListenerCore, ch: AbstractChannel, acts: list[Action]) -> None:
        for a in acts:
            if ch is not self._ch or ch.is_closed:
                return  # tags of a closed channel are worthless: never sent elsewhere
            if isinstance(a, Republish):
                ok, unroutable, error = await publish_copy(ch, a)
                again = core.republished(a.token, ok, unroutable=unroutable, error=error)
                await self._execute(core, ch, again)
            else:
                await send_settles(ch, (a,))

    async def publish(
        self,
        routing_key: str,
        body: bytes | str,
        *,
        exchange: str = "",
        headers: Mapping[str, Any] | None = None,
        message_id: str | None = None,
        content_type: str | None = "application/json",
        persistent: bool = True,
        **props: Any,
    ) -> None:
        """Publish with publisher confirms (raises if the broker refuses or cannot route)."""
        if isinstance(body, str):
            body = body.encode()
        p = spec.Basic.Properties(
            **publish_properties(headers, message_id, content_type, persistent, props)
        )
        async with self._lock:
            ch = await self._channel()
            conf = await ch.basic_publish(
                body, exchange=exchange, routing_key=routing_key, properties=p, mandatory=True
            )
        if not isinstance(conf, spec.Basic.Ack):
            raise RuntimeError(f"publish to {routing_key!r} was not confirmed: {conf!r}")

    async def declare_queue(self, name: str, arguments: Mapping[str, Any] | None = None) -> None:
        async with self._lock:
            ch = await self._channel()
            await ch.queue_declare(name, durable=True, arguments=dict(arguments or {}) or None)

    async def close(self) -> None:
        async with self._lock:
            conn, self._conn, self._amqp, self._ch = self._conn, None, None, None
            if conn is not None and not conn.is_closed:
                await conn.close()


@asynccontextmanager
async def aconnect(
    url: str = "amqp://guest:guest@127.0.0.1:5672/%2f", **kw: Any
) -> AsyncIterator[AsyncPullConnection]:
    """`async with ackkit.aconnect(url) as conn: d = await conn.get("q")` - pull mode."""
    conn = AsyncPullConnection(url, **kw)
    await conn.open()
    try:
        yield conn
    finally:
        await conn.close()
