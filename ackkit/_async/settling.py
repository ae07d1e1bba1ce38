"""ChannelSettler: a listener core's actions carried out on its channel, in decision order.

The listener's `ListenerCore` decides every ack, nack, reject, copy and
transaction frame; `ChannelSettler` (the settling half of `AsyncConsumer`, and
of each queue of an `AsyncPullConnection`) only sends them:

* on the channel of the generation they were decided for, or not at all: a
  delivery tag is channel-scoped, and a stale one closes the new channel with
  PRECONDITION_FAILED. The check is repeated before every frame, since each
  send may await;
* one action list at a time, in the order the core decided them (the
  `settling` lock, FIFO): a straggler's single ack overtaken by a later
  multiple-ack that covers it would be an unknown delivery tag;
* never waiting for ever on a connection that died: aiormq's write queue is
  bounded (10 frames) and only its writer, gone with the connection, makes room.
  A send waiting for room is given up when its channel closes (`until_closed`);
  before, it held the settling lock for ever, and with it every later settle of
  the listener, on its new channel too, and the runtime's tick (the listener
  consumed nothing more, its prefetch full of finished, unacked deliveries).

A `Fence` is awaited in place: basic.qos with the listener's own prefetch (a no-op
round trip, answered after every frame sent before it), so that a held copy's
handler starts only once the broker has processed its original's ack, not when
aiormq merely queued the frame; what is after it waits with it (the `settling` lock).

Copies (`Republish`) go to the runtime's confirm publisher, which reports
back to the core (`ListenerCore.republished`) and settles through `execute`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Protocol, TypeVar

from aiormq.abc import AbstractChannel

from .._core import actions as A
from .._core.actions import Action, Republish
from .._core.listener import ListenerCore
from .._core.step import Step
from .._interpreter.dispatch import Op, operations, settles, stale
from .._interpreter.originals import Originals
from .._messages.delivery import DeliveryBase
from .._telemetry.logs import short
from ._amqp import CHANNEL_GONE

log = logging.getLogger("ackkit")

T = TypeVar("T")


class ChannelClosedFirst(ConnectionError):
    """The channel closed while a send on it waited (given up: see `until_closed`)."""


def has_room(ch: AbstractChannel) -> bool:
    """Does a frame go into `ch`'s connection's write queue without waiting? (True for a
    channel without one: the test fakes.)"""
    queue = getattr(getattr(ch, "connection", None), "write_queue", None)
    return not isinstance(queue, asyncio.Queue) or not queue.full()


async def until_closed(ch: AbstractChannel, aw: Awaitable[T]) -> T:
    """`await aw` (a send on `ch`), given up with ChannelClosedFirst once `ch` closes: a
    dead connection's full write queue is never drained, its put never returns."""
    task = asyncio.ensure_future(aw)
    closing = ch.closing  # an observer of its own: cancelled below, not the channel
    try:
        await asyncio.wait({task, closing}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:  # the caller was cancelled: so is the send
        task.cancel()
        raise
    finally:
        closing.cancel()
    if task.done():
        return task.result()
    task.cancel()
    await asyncio.wait({task})  # its CancelledError stays in it; the caller's does not
    if not task.cancelled():
        task.exception()  # retrieved: it failed on its own as it was cancelled
    raise ChannelClosedFirst(f"channel {getattr(ch, 'number', '?')} closed before the send")


async def send_settle(ch: AbstractChannel, a: Action) -> None:
    """The basic.ack / nack / reject frame of settle action `a` on `ch` (not waited for)."""
    t = type(a)
    if t is A.Ack:
        await ch.basic_ack(a.tag, multiple=a.multiple, wait=False)  # type: ignore[union-attr]
    elif t is A.Nack:
        await ch.basic_nack(a.tag, multiple=a.multiple, requeue=a.requeue, wait=False)  # type: ignore[union-attr]
    elif t is A.Reject:
        await ch.basic_reject(a.tag, requeue=a.requeue, wait=False)  # type: ignore[union-attr]


class Republisher(Protocol):
    """Publishes the copies a listener's core asks for (retry delays, dead letters)."""

    def submit(self, c: ChannelSettler, a: Republish, original: DeliveryBase) -> None: ...


class SettlerHost(Protocol):
    """What a ChannelSettler needs from the runtime: its loop and its copy publisher."""

    @property
    def loop(self) -> asyncio.AbstractEventLoop: ...
    @property
    def publisher(self) -> Republisher: ...


class ChannelSettler:
    """Carries out one listener core's actions on the listener's current channel.

    Implements both settler protocols: `asettle` for AsyncDelivery (async
    handlers), `settle` for the plain Delivery of a `def` handler running in
    a thread pool (it hands the settle to the loop and waits).
    """

    def __init__(self, rt: SettlerHost, name: str, core: ListenerCore) -> None:
        self.rt = rt
        self.name = name
        self.core = core
        self.copies: Republisher = rt.publisher  # a consumer has a confirm channel of its own
        self.channel: AbstractChannel | None = None
        # Settle frames leave in the order the core decided them (asyncio.Lock is FIFO and
        # every caller enters execute() right after deciding, without awaiting in between).
        self.settling = asyncio.Lock()
        # tag -> the Delivery; token -> the original of a copy in flight
        self.originals: Originals[DeliveryBase] = Originals()

    async def execute(self, step: Step) -> None:
        """Carry out `step`'s actions on the channel of its generation, or drop them.

        One at a time, in decision order: a straggler's single ack overtaken (while it
        waits for room in the connection's write queue) by a later multiple-ack that
        covers it is an unknown delivery tag, and the broker closes the channel.
        """
        self.originals.decided(step.generation, step.actions)  # right after the core decided
        async with self.settling:
            await self._execute(step)

    async def _execute(self, step: Step) -> None:
        core = self.core
        ch = self.channel
        gen = step.generation
        try:
            for i, op, x in operations(step, self.originals):
                # asked before every operation: each send may await
                if ch is None or ch is not self.channel or ch.is_closed or not core.current(gen):
                    self._drop(Step(gen, step.actions[i:]), len(step))
                    return
                if op is Op.SETTLE:
                    if has_room(ch):  # the usual case: the frame is queued at once
                        await send_settle(ch, x)
                    else:
                        await until_closed(ch, send_settle(ch, x))
                elif op is Op.PUBLISH:
                    original = self.originals.copy(x.token)
                    if original is not None:
                        self.copies.submit(self, x, original)
                elif op is Op.RUN:
                    self.run_ready(x)
                elif op is Op.START:
                    self.start_held(x)
                elif op is Op.CONSUME:
                    await self.switch_consumer(x)
                elif op is Op.FENCE:
                    # a round trip answered after every frame sent before it; the rest
                    # goes on checked as above (a closing channel also fails this call)
                    await ch.basic_qos(prefetch_count=core.policy.prefetch)
                    await self._execute(x)
                elif op is Op.TX_COMMIT:
                    await until_closed(ch, ch.tx_commit())
                elif op is Op.TX_SELECT:
                    await until_closed(ch, ch.tx_select())
        except CHANNEL_GONE as exc:
            log.info("%s: channel lost while settling: %s", self.name, short(exc))

    def _drop(self, rest: Step, decided: int) -> None:
        """What is left of a step (`rest`) is for a channel that is gone: nothing goes
        out; its Runs still go to a handler task (`begin` finds them stale and frees the
        serial keys they hold)."""
        runs, _ = stale(rest, self.originals)
        if settles(rest):
            log.info("%s: dropped %d settle actions for a closed channel", self.name, decided)
        for d in runs:
            self.run_ready(d)

    def start_held(self, d: DeliveryBase) -> None:
        """Start the handler of `d`, a delivery the core held (consumers only)."""
        raise NotImplementedError

    async def switch_consumer(self, on: bool) -> None:
        """Hold a consumer on the queue (`on`) or cancel it (a gated core's `Consume`;
        consumers only). Runs holding the settle lock: what it decides in turn goes to
        `_execute`."""
        raise NotImplementedError

    def run_ready(self, d: DeliveryBase) -> None:
        """Queue `d` for a handler: the flow gate let it through (`Run`; consumers only)."""
        raise NotImplementedError

    async def _asettle(
        self, delivery: DeliveryBase, kind: str, requeue: bool, multiple: bool
    ) -> None:
        """`await AsyncDelivery.ack()/nack()/reject()` (AsyncSettler protocol)."""
        core = self.core
        step = core.settle(delivery._tracked, kind, requeue=requeue, multiple=multiple)
        if step.actions:
            await self.execute(step)

    def _settle(self, delivery: DeliveryBase, kind: str, requeue: bool, multiple: bool) -> None:
        """`Delivery.ack()` from a `def` handler in the thread pool (Settler protocol)."""
        self.blocking(lambda: self._asettle(delivery, kind, requeue, multiple), "Delivery.ack()")

    def blocking(self, make: Callable[[], Coroutine[Any, Any, None]], what: str) -> None:
        """Run the coroutine `make()` on the loop and wait for it (a `def` handler's thread)."""
        loop = self.rt.loop
        try:
            current = asyncio.get_running_loop()
        except RuntimeError:
            current = None
        if current is loop:
            raise RuntimeError(
                f"a blocking {what} on the event loop would deadlock; async handlers get an "
                f"AsyncDelivery: use `await delivery.{what.split('.')[-1]}`"
            )
        asyncio.run_coroutine_threadsafe(make(), loop).result()

    async def tick(self) -> None:
        core = self.core
        if self.channel is None or not core.open:
            return
        step = core.tick()
        if step.actions:
            await self.execute(step)

    async def drain(self) -> None:
        step = self.core.drain()
        if step.actions:
            await self.execute(step)
