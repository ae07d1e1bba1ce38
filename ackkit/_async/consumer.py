"""AsyncConsumer: one listener's deliveries on its own aiormq channel, from arrival to settle.

Every decision comes from the listener's `ListenerCore`; this module only
carries the actions out on the channel (aio-pika's transport, aiormq):

* Deliveries arrive through `basic_consume` on the listener's own channel.
  aiormq already runs each consumer callback as a task of that channel, so a
  delivery costs no extra task here: the callback runs the handler itself when
  a concurrency slot is free, else parks the delivery in a backlog that the
  running callbacks work off in delivery order.
* Tags are fenced by channel generation: every action list is executed only if
  the core's generation is still the one it was decided for and the channel
  object is the one of that generation; the check is repeated after every
  await. Channel numbers are never reused on a connection (`ChannelNumbers`),
  so a frame queued for a closed channel cannot reach its successor.
* Frames leave in the order the core decided them (`ChannelSettler`).
* Handlers complete out of order with `max_concurrency` > 1. The core's window
  then acks the contiguous settled prefix with one multiple-ack and, at flush
  time (count, `tick()` interval, drain), acks stragglers behind an unfinished
  delivery one by one: a multiple-ack never covers a delivery still in a
  handler, and acked work is not held back by one slow handler.
* A lost channel cancels the handler tasks of its deliveries (aiormq cancels a
  channel's tasks on close): the broker has requeued those deliveries and
  their outcome could no longer be acknowledged anyway. Cancellation is never
  a failure: the delivery is released (requeued), not retried or dead-lettered.

Handler runs and releases are in `handlers`, batch collection in `batching`,
flow control in `flowing`. The consumer sees the runtime that owns it only
through `ConsumerHost`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections import deque
from collections.abc import Callable, Coroutine, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import aiormq.exceptions
from aiormq.abc import AbstractChannel, AbstractConnection, DeliveredMessage

from .._app.spec import Instrument, ListenerSpec, probe_for
from .._connection.salvage import describe
from .._core.actions import Consume, TxSelect
from .._core.consume import RETRY_DELAY
from .._core.events import Observer
from .._core.listener import ListenerCore
from .._core.policy import AckMode
from .._core.step import Step
from .._messages.delivery import Delivery, DeliveryBase
from .._messages.publish import Outgoing
from .._telemetry.logs import FailureLog, log_cancel, short
from . import _frames as frames
from . import flowing, handlers, refusals
from ._amqp import CHANNEL_GONE, ChannelNumbers
from .batching import Batcher
from .delivery import AsyncDelivery
from .host import ConsumerHost as ConsumerHost
from .publisher import AsyncPublisher
from .settling import ChannelSettler

if TYPE_CHECKING:
    from ..inbox._aio import AsyncInbox

log = logging.getLogger("ackkit")
CANCEL_TIMEOUT = 5.0
CHANNEL_REOPEN_DELAY = RETRY_DELAY

Unit = DeliveryBase | list[DeliveryBase]
"""What one handler invocation gets: a delivery, or a batch of them."""


class AsyncConsumer(ChannelSettler):
    """One listener on one channel (re-opened as a new generation after a loss).

    Its deliveries settle through the `ChannelSettler` it is: `await d.ack()` in
    async handlers, a blocking `d.ack()` in `def` handlers on its thread pool.
    """

    def __init__(
        self,
        rt: ConsumerHost,
        spec: ListenerSpec,
        observer: Observer | None,
        instruments: Sequence[Instrument] = (),
    ) -> None:
        core = spec.consumer_core(observer)
        super().__init__(rt, spec.name, core)
        self.rt: ConsumerHost = rt
        # this listener's own confirm channel for its copies: another listener's refused
        # copy, or a handler's publish to a missing exchange, never closes it
        self.copies: AsyncPublisher = AsyncPublisher(rt)
        self.spec = spec
        self.binding = spec.binding
        self.is_async = spec.binding.is_async
        self.delivery_cls = AsyncDelivery if self.is_async else Delivery
        self.no_ack = spec.policy.mode is AckMode.NONE
        self.queue = spec.queue
        self.limit = spec.concurrency
        self.consumer_tag: str | None = None
        self.running = 0
        self.backlog: deque[Unit] = deque()
        self.tasks: set[asyncio.Task[Any]] = set()
        self.batcher: Batcher | None = None
        if spec.batch_size:
            self.batcher = Batcher(spec.batch_size, spec.batch_timeout, rt.loop, self.start)
        self.pool: ThreadPoolExecutor | None = None
        self._opening = False
        self.consuming = False  # a basic.consume is on its way
        # what a refused or cancelled consumer comes to (the core's `Consuming`)
        self.consume_state = spec.consuming(self.core)
        self.refused_on: AbstractChannel | None = None  # the channel whose consume was refused
        self._reasons: frames.Reasons | None = None  # of the channel's connection
        self.failures = FailureLog(log)
        # metrics, tracing: None when off
        self.probe = probe_for(instruments, spec, self.core)
        self.tx: AsyncInbox | None = None  # inbox=: the handler runs in its transaction
        if spec.inbox is not None:
            from ..inbox._aio import AsyncInbox

            self.tx = AsyncInbox(spec.inbox, InboxHost(self))
        if not self.is_async:
            self.pool = ThreadPoolExecutor(
                max_workers=spec.concurrency, thread_name_prefix=f"ackkit-{spec.name}"
            )

    # -- channel lifecycle -------------------------------------------------------

    async def open(self, conn: AbstractConnection, numbers: ChannelNumbers) -> None:
        if self._opening or (self.channel is not None and not self.channel.is_closed):
            return
        self._opening = True
        try:
            ch = await conn.channel(numbers.take(), publisher_confirms=False)
            if self.rt.stopping:
                await ch.close()
                return
            acts = self.core.channel_opened()
            self.channel = ch
            if self.tx is not None:
                self.tx.started()  # the inbox's relay and retention tasks
            self._reasons = frames.reasons_of(conn)
            ch.closing.add_done_callback(functools.partial(self._on_channel_closed, ch))
            ch.on_consumer_cancel_callbacks.add(functools.partial(self._on_cancelled, ch))
            if any(type(a) is TxSelect for a in acts):
                await ch.tx_select()
            await ch.basic_qos(prefetch_count=self.spec.policy.prefetch)
            if self.core.gating.consuming:  # not while paused or tripped
                await self.consume(ch)
        finally:
            self._opening = False

    async def consume(self, ch: AbstractChannel) -> None:
        spec = self.spec
        self.consuming = True
        try:
            ok = await ch.basic_consume(
                self.queue,
                self._deliver,
                no_ack=self.no_ack,
                exclusive=spec.exclusive,
                arguments=spec.consumer_arguments or None,
            )
        except aiormq.exceptions.ChannelClosed as exc:  # refused: the core decides
            self.consuming = False
            refusals.refused(self, ch, exc)
            return
        finally:
            self.consuming = False
        self.consumer_tag = ok.consumer_tag
        refusals.consume_ok(self)
        if not self.core.gating.consuming:  # paused while the broker answered: no cancel went
            await self.execute(Step(self.core.generation, [Consume(False)]))  # (no tag yet)

    def _on_channel_closed(self, ch: AbstractChannel, fut: asyncio.Future[Any]) -> None:
        reason = None if fut.cancelled() else fut.exception()
        if ch is not self.channel:
            return
        if self.consuming:  # closed before the broker answered basic.consume: refused
            refusals.refused(self, ch, reason)
            return
        self.lost(reason)
        conn = self.rt.amqp
        if not self.rt.stopping and conn is not None and not conn.is_closed:
            # (None, None): closed by ackkit itself (after a broker's cancel), no error
            if reason is not None and refusals.refusal(reason)[0] not in (None, 200):
                log.error("%s: channel closed by the broker: %s", self.spec.name, short(reason))
            self.rt.spawn(self.reopen_later(conn))

    def _on_cancelled(self, ch: AbstractChannel, frame: Any) -> None:
        """basic.cancel from the broker (RabbitMQ 4.3's consumer timeout, a deleted
        queue): the core fences the consumer's deliveries; a new channel consumes again."""
        if ch is not self.channel or self.rt.stopping:
            return
        outstanding = self.core.consumer_cancelled()
        log_cancel(log, self.spec.name, outstanding)
        self.consumer_tag = None
        # Not awaited here: aiormq calls this from the channel's frame reader, which the
        # close must leave free to read the broker's close-ok.
        self.rt.spawn(self._close_after_cancel(ch))

    async def _close_after_cancel(self, ch: AbstractChannel) -> None:
        with contextlib.suppress(*CHANNEL_GONE, TimeoutError):
            await ch.close()  # -> _on_channel_closed: a new channel after the usual pause

    def lost(self, reason: BaseException | None) -> None:
        """The channel is gone: its tags are stale, its unstarted deliveries too."""
        if self.channel is None:
            return
        lost = self.core.channel_closed()
        self.channel = None
        self.consumer_tag = None
        self.backlog.clear()  # their tags died with the channel; the broker requeued them
        if self.batcher is not None:
            self.batcher.take()  # a partial batch: the same
        if lost:
            log.info(
                "%s: channel closed with %d deliveries unsettled (broker requeues them)",
                self.spec.name,
                lost,
            )

    async def reopen_later(
        self, conn: AbstractConnection, delay: float = CHANNEL_REOPEN_DELAY
    ) -> None:
        await asyncio.sleep(delay)
        if self.rt.stopping or self.rt.amqp is not conn or conn.is_closed:
            return
        try:
            await self.open(conn, self.rt.numbers)
        except (TimeoutError, *CHANNEL_GONE) as exc:
            log.warning("%s: reopening the channel failed: %s", self.spec.name, short(exc))
            if self.channel is None:
                self.rt.spawn(self.reopen_later(conn))

    async def cancel(self, timeout: float = CANCEL_TIMEOUT) -> None:
        ch, tag = self.channel, self.consumer_tag
        if ch is None or ch.is_closed or tag is None:
            return
        with contextlib.suppress(*CHANNEL_GONE, TimeoutError):
            await ch.basic_cancel(tag, timeout=timeout)
        self.consumer_tag = None

    # -- deliveries ----------------------------------------------------------------

    async def _deliver(self, msg: DeliveredMessage) -> None:
        """aiormq's consumer callback (already a task of the channel)."""
        try:
            if msg.channel is not self.channel:
                return  # a late delivery of a closed channel: the broker requeued it
            d = self._receive(msg)
            t = d._tracked
            self.originals.put(t.generation, t.tag, d)
            if t.verdict is not None:
                if t.verdict:
                    await self.execute(Step(t.generation, t.verdict))
                    if self.no_ack:  # the broker settled it on send: its copy has its original
                        self.originals.drop(t.generation, t.tag)
            elif self.running < self.limit and self.batcher is None:
                await self._run(d)  # what `_admit` comes to: a free slot, no batch
            else:
                await self._admit(d)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # a bug of ours: stop visibly, never a silent zombie
            self.rt.fail(exc, f"{self.spec.name}: delivery task failed")

    def _receive(self, msg: DeliveredMessage) -> DeliveryBase:
        """The core tracks the delivery (and may decide its fate at once, `verdict`)."""
        dv: Any = msg.delivery
        props = msg.header.properties
        core = self.core
        exchange = dv.exchange or ""
        rk = dv.routing_key or ""
        redelivered = bool(dv.redelivered)
        reasons = self._reasons
        why = reasons.pop(msg.channel.number, dv.delivery_tag) if reasons is not None else None
        try:
            t = core.receive(
                dv.delivery_tag,
                redelivered,
                None if why else props.headers,
                exchange,
                rk,
                None if why else props.message_id,
                unreadable=why,
                properties=None if why else props,
            )
        except Exception as exc:  # never let one delivery stop the queue
            why = f"receiving it failed: {describe(exc)}"
            t = core.receive(dv.delivery_tag, redelivered, None, exchange, rk, unreadable=why)
        return self.delivery_cls(
            msg.body,
            props,
            t,
            self,
            exchange=exchange,
            routing_key=rk,
            redelivered=redelivered,
            queue=self.queue,
            decoder=self.binding.decoder,
        )

    def start_held(self, d: DeliveryBase) -> None:
        """Start a delivery the core held (from `execute`, which holds the settle lock:
        the handler runs in a task of its own)."""
        self.rt.spawn(self._start_held(d))

    async def _start_held(self, d: DeliveryBase) -> None:
        t = d._tracked
        acts = self.core.gating.admit(t)  # through the flow gate
        if acts is None:
            await self._admit(d)
        elif acts:
            await self.execute(Step(t.generation, acts))

    async def switch_consumer(self, on: bool) -> None:
        await flowing.switch(self, on)

    def run_ready(self, d: DeliveryBase) -> None:
        self.start(d)

    async def _admit(self, d: DeliveryBase) -> None:
        """Run it: in a batch, or queued behind the running handlers."""
        unit: Unit = d
        if self.batcher is not None:
            batch = self.batcher.add(d)
            if batch is None:
                return
            unit = batch
        if self.running >= self.limit:
            self.backlog.append(unit)
            return
        await self._run(unit)

    async def _run(self, unit: Unit) -> None:
        """Run a handler for `unit`, then for backlog items while there are any."""
        self.running += 1
        task = asyncio.current_task(self.rt.loop)
        if task is not None:
            self.tasks.add(task)
        try:
            while True:
                ds = unit if isinstance(unit, list) else [unit]
                try:
                    await handlers.handle(self, ds)
                finally:
                    if self.no_ack:  # no settle frame ends them: done with here
                        for d in ds:
                            self.originals.drop(d._tracked.generation, d._tracked.tag)
                if not self.backlog:
                    return
                unit = self.backlog.popleft()
        finally:
            self.running -= 1
            if task is not None:
                self.tasks.discard(task)

    def start(self, unit: Unit) -> None:
        """Run `unit`'s handler when a concurrency slot is free (the gate let a delivery
        through, or a partial batch is due)."""
        if self.running >= self.limit:
            self.backlog.append(unit)
        else:
            self.rt.spawn(self._run(unit))

    async def apublish_message(self, msg: Outgoing) -> None:
        """`await AsyncDelivery.publish()` / `reply()` from an async handler (an inbox
        listener's: written to its outbox, in the handler's transaction)."""
        if self.tx is not None and await self.tx.enqueue(msg):
            return
        await self.rt.publish(msg)

    def publish_message(self, msg: Outgoing) -> None:
        """`Delivery.publish()` / `reply()` from a `def` handler in the thread pool."""
        self.blocking(lambda: self.rt.publish(msg), "Delivery.publish()")

    async def stop(self) -> None:
        """The app stops, its consumer cancelled: the core starts nothing from now on; its
        held acks, and the copies of what it kept since `Shutdown.hold`, go out."""
        acts = self.core.shutdown.stop()
        if acts:
            await self.execute(acts)

    async def release_unstarted(self) -> None:
        """Shutdown: the deliveries that never reached a handler go back to the queue."""
        await handlers.release_unstarted(self)

    async def give_back(self) -> None:
        """Shutdown, no time left for more copies: the unstarted deliveries still waiting
        for one go back to the queue as they are."""
        acts = self.core.shutdown.give_back()
        if acts:
            await self.execute(acts)


class InboxHost:
    """The consumer as its inbox sees it (`ackkit.inbox._host.AsyncHost`)."""

    __slots__ = ("c", "name")

    def __init__(self, c: AsyncConsumer) -> None:
        self.c = c
        self.name = c.spec.name

    @property
    def stopping(self) -> bool:
        return self.c.rt.stopping

    async def decide(self, fn: Callable[[ListenerCore], Step | None]) -> None:
        step = fn(self.c.core)
        if step:
            await self.c.execute(step)

    async def wait(self, seconds: float) -> bool:
        return await self.c.rt.pause(seconds)

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        return self.c.rt.spawn(coro)

    async def publish(self, msg: Outgoing) -> None:
        await self.c.rt.publish(msg)
