"""Pull mode on asyncio: basic.get one message at a time, settled on its own channel.

As the sync pull: a listener with prefetch 0. Each queue's MANUAL core decides, the
AsyncApp's `ChannelSettler` carries its actions out on the pull channel (`_Queue`),
and its copies go through the AsyncApp's confirm publisher (`AsyncPublisher`); a
get or settle returns once its copies are confirmed and their originals settled.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

import aio_pika
from aiormq.abc import AbstractChannel, AbstractConnection
from pamqp import commands as spec

from .._connection.io import ConnectFailed
from .._core.errors import PublishNotConfirmed
from .._core.listener import ListenerCore
from .._core.policy import DLQ_DEFAULT
from .._core.step import Step
from .._interpreter.pulling import SKIP_LIMIT, SKIP_SECONDS, PullBase, Skips
from .._messages.delivery import DeliveryBase
from .._messages.publish import Outgoing, apublishes
from . import _frames as frames
from ._amqp import CHANNEL_GONE, ChannelNumbers, open_connection
from .delivery import AsyncDelivery
from .publisher import AsyncPublisher, carry
from .settling import ChannelSettler

log = logging.getLogger("ackkit.pull")

CLOSE_TIMEOUT = 10.0
"""Seconds close() waits for the broker to confirm the channel's frames (Channel.CloseOk)."""


class AsyncPullConnection(PullBase["_Queue"]):
    """An asyncio connection for basic.get and publishing (tests, scripts, tools).

    Use `async with ackkit.aconnect(url) as conn:`. Each queue gets a MANUAL
    listener core: `await d.ack()` / `nack()` / `reject()` settle exactly once,
    reject/nack without requeue dead-letter to `<queue>.dlq`, and a delivery
    fetched on a channel that has since closed is never settled on its
    successor. close() (and leaving `async with`, also on an exception) waits
    until the broker has carried out every settle made before it.

    A cancelled `await conn.get(q)` does not lose the message: the fetch runs
    to its end and a delivery nobody received goes back to the queue. A
    cancelled `await d.ack()` still settles.
    """

    _kind = "AsyncPullConnection"

    def _setup_client(self) -> None:
        """Nothing connects yet: `open()` or the first call does."""
        self._conn: aio_pika.abc.AbstractConnection | None = None
        self._amqp: AbstractConnection | None = None
        self._ch: AbstractChannel | None = None
        self._numbers = ChannelNumbers()
        self._lock = asyncio.Lock()
        self._inner: set[asyncio.Future[Any]] = set()
        self._stuck = False  # a publish got no answer: close() does not wait for one
        self._host = _Host(self)
        self._copies = self._host.publisher  # retry / dead-letter copies, confirmed

    async def open(self) -> AsyncPullConnection:
        """Connect now (else the first call connects); returns the connection."""
        self._check_open("open()")
        await self._channel()
        return self

    async def _shielded(self, coro: Any) -> Any:
        """Run `coro` to its end even if the caller is cancelled (kept until close())."""
        task = asyncio.ensure_future(coro)
        self._inner.add(task)
        task.add_done_callback(self._inner.discard)
        return await asyncio.shield(task)

    async def _connect(
        self, lost: bool
    ) -> tuple[aio_pika.abc.AbstractConnection, AbstractConnection]:
        """A connection to the first node address that takes one, starting at the
        current one (after a `lost` connection, the next one), once around."""
        for url, last in self._nodes(lost):
            try:
                return await open_connection(
                    url,
                    heartbeat=self.heartbeat,
                    name="ackkit-pull",
                    timeout=10.0,
                    tls=self._tls[url],
                )
            except ConnectFailed as exc:
                if last:
                    raise
                self._failed(url, str(exc))
        raise AssertionError("unreachable")  # pragma: no cover

    async def _channel(self) -> AbstractChannel:
        self._check_open("channel")
        if self._amqp is None or self._amqp.is_closed:
            self._conn, self._amqp = await self._connect(lost=self._amqp is not None)
            self._numbers = ChannelNumbers()
            self._ch = None
        if self._ch is None or self._ch.is_closed:
            self._ch = await self._amqp.channel(self._numbers.take(), publisher_confirms=True)
            self._channel_replaced(self._ch)
        return self._ch

    async def _queue(self, queue: str, dead_letter: str | None) -> _Queue:
        q = self._queues.get(queue)
        if q is None:
            ch = await self._channel()
            assert self._amqp is not None
            core = self._new_core(queue, dead_letter, self._amqp.server_properties)
            q = self._keep(queue, _Queue(self._host, core), ch)
        return q

    async def get(
        self,
        queue: str,
        *,
        dead_letter: str | None = DLQ_DEFAULT,
        max_skip: int = SKIP_LIMIT,
        max_seconds: float = SKIP_SECONDS,
    ) -> AsyncDelivery | None:
        """basic.get with manual ack: an AsyncDelivery to settle, or None if the queue is empty.

        A message that must not reach the caller (a garbage attempt header, ...) is
        dead-lettered here and the next one fetched; past `max_skip` such messages or
        about `max_seconds` in one call it returns None although the queue may hold
        more. Cancelling the await does not lose a message: the fetch finishes and
        a delivery the caller never received is requeued. get() declares nothing:
        the dead-letter queue (`dead_letter`, by default `<queue>.dlq`) is declared
        with the first dead letter sent to it.
        """
        self._check_open("get()")
        task = asyncio.ensure_future(self._get(queue, dead_letter, max_skip, max_seconds))
        self._inner.add(task)
        task.add_done_callback(self._inner.discard)
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            task.add_done_callback(self._give_back)
            raise

    def _give_back(self, task: asyncio.Future[AsyncDelivery | None]) -> None:
        """The caller of get() was cancelled: requeue what the fetch returned."""
        if task.cancelled() or task.exception() is not None:
            return
        d = task.result()
        if d is None or d.settled:
            return
        back = asyncio.ensure_future(self._settle_locked(d, "nack", True, False))
        self._inner.add(back)
        back.add_done_callback(self._inner.discard)
        back.add_done_callback(lambda f: f.cancelled() or f.exception())  # never "never retrieved"

    async def _get(
        self, queue: str, dead_letter: str | None, max_skip: int, max_seconds: float
    ) -> AsyncDelivery | None:
        skips = Skips(queue, max_skip, max_seconds)
        async with self._lock:
            self._check_open("get()")
            q = await self._queue(queue, dead_letter)
            core = q.core
            while True:
                ch = await self._channel()
                msg = await ch.basic_get(queue, no_ack=False)
                dv = msg.delivery
                if not isinstance(dv, spec.Basic.GetOk) or dv.delivery_tag is None:
                    return None
                props = msg.header.properties
                exchange = dv.exchange or ""
                rk = dv.routing_key or ""
                why = frames.unreadable(ch.connection, ch.number, dv.delivery_tag)
                t = core.receive(
                    dv.delivery_tag,
                    bool(dv.redelivered),
                    None if why else props.headers,
                    exchange,
                    rk,
                    unreadable=why,  # dead-lettered by the core's verdict
                )
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
                q.originals.put(t.generation, t.tag, d)
                if t.verdict is None:
                    return d
                await self._carry(q, Step(t.generation, t.verdict))  # e.g. a forged attempt header
                if skips.one_more():
                    return None

    async def _asettle(
        self, delivery: DeliveryBase, kind: str, requeue: bool, multiple: bool
    ) -> None:
        """AsyncSettler protocol: carry out `await d.ack()` / nack / reject.

        Runs to its end even if the awaiting task is cancelled."""
        await self._shielded(self._settle_locked(delivery, kind, requeue, multiple))

    async def _settle_locked(
        self, delivery: DeliveryBase, kind: str, requeue: bool, multiple: bool
    ) -> None:
        async with self._lock:
            q = self._settling(delivery, kind, self._ch is not None and not self._ch.is_closed)
            t = delivery._tracked
            acts = q.core.settle(t, kind, requeue=requeue, multiple=multiple)
            if acts.actions:  # decided for its own channel: a stale delivery gets none
                await self._carry(q, acts)
            self._settled(q, delivery, kind, acts)

    async def _carry(self, q: _Queue, step: Step) -> None:
        """Carry out what `q`'s core decided, and wait for the copies it published (and
        what their confirms settle)."""
        await q.execute(step)
        while self._copies.pending:
            await asyncio.wait(set(self._copies.pending))

    @apublishes
    async def publish(self, msg: Outgoing) -> None:
        """Publish a message and wait for the broker's confirm."""
        await self.apublish_message(msg)

    async def apublish_message(self, msg: Outgoing) -> None:
        """AsyncMessagePublisher protocol: carry a built message, confirmed."""
        async with self._lock:
            self._check_open("publish()")
            ch = await self._channel()
            try:
                await carry(ch, msg)
            except PublishNotConfirmed:
                # No answer on an open channel: a broker that blocks publishers (a memory
                # or disk alarm) reads nothing more from it; close() does not wait for one.
                self._stuck = not ch.is_closed
                raise

    async def declare_queue(self, name: str, arguments: Mapping[str, Any] | None = None) -> None:
        """Declare a durable queue (with x-arguments), e.g. before the first `get()`."""
        async with self._lock:
            self._check_open("declare_queue()")
            ch = await self._channel()
            await ch.queue_declare(name, durable=True, arguments=dict(arguments or {}) or None)

    async def close(self) -> None:
        """Close the channel, then the connection (a second call does nothing).

        Settles are sent without waiting (wait=False) and closing the connection
        drops frames still queued in the client, so the channel is closed with a
        round trip first: the broker handles a channel's frames in order, so once
        it answered Channel.CloseOk every ack, nack and reject sent before has been
        carried out. Fetches and settles still running (a cancelled caller's) finish
        first; deliveries not settled by then go back to their queue.
        """
        if self._closed:
            return
        deadline = time.monotonic() + CLOSE_TIMEOUT
        while self._inner and time.monotonic() < deadline:  # a give-back may add one
            await asyncio.wait(set(self._inner), timeout=deadline - time.monotonic())
        async with self._lock:
            if self._closed:
                return
            self._closed = True
            self._channel_gone()
            conn, ch = self._conn, self._ch
            self._conn, self._amqp, self._ch = None, None, None
            if self._stuck:  # a round trip would wait for an answer that does not come
                log.warning(
                    "closing the pull connection without waiting: a publish got no answer "
                    "(is the broker blocking publishers?); unsettled deliveries go back"
                )
                ch = None
            try:
                if ch is not None and not ch.is_closed:
                    left = max(deadline - time.monotonic(), 0.5)
                    await asyncio.wait_for(ch.close(), left)
            except (TimeoutError, *CHANNEL_GONE) as exc:
                log.warning("closing the pull channel: %r", exc)
            if conn is not None and not conn.is_closed:
                left = max(deadline - time.monotonic(), 1.0)
                try:
                    await asyncio.wait_for(conn.close(), left)
                except TimeoutError:
                    log.warning("closing the pull connection: no answer within %.1f s", left)


@asynccontextmanager
async def aconnect(
    url: str | Sequence[str] = "amqp://guest:guest@127.0.0.1:5672/%2f", **kw: Any
) -> AsyncIterator[AsyncPullConnection]:
    """`async with ackkit.aconnect(url) as conn: d = await conn.get("q")` - pull mode."""
    conn = AsyncPullConnection(url, **kw)
    await conn.open()
    try:
        yield conn
    finally:
        await conn.close()


class _Host:
    """The pull connection as its settlers' SettlerHost and its copy publisher's
    PublisherHost: the copies' confirm channel opens on the connection's AMQP
    connection, numbered by its ChannelNumbers."""

    __slots__ = ("_conn", "publisher")

    def __init__(self, conn: AsyncPullConnection) -> None:
        self._conn = conn
        self.publisher = AsyncPublisher(self)

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return asyncio.get_running_loop()

    @property
    def amqp(self) -> AbstractConnection | None:
        return self._conn._amqp

    @property
    def numbers(self) -> ChannelNumbers:
        return self._conn._numbers


class _Queue(ChannelSettler):
    """One queue's pulled deliveries: the AsyncApp's settler on the pull channel (a
    pull core holds no copies and has no consumer: no `Start`, `Consume` or `Run`)."""

    def __init__(self, host: _Host, core: ListenerCore) -> None:
        super().__init__(host, core.policy.name, core)
