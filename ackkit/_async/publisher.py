"""AsyncPublisher: the confirm-mode channel that publishes the copies listeners' cores ask
for, and the app's own messages (`AsyncApp.publish`, `Delivery.publish` / `reply`).

A copy (retry delay, dead letter) is published on its own task; whether it was
confirmed, returned or not publishable at all goes back to the listener's core
(`ListenerCore.republished`), which decides how its original is settled. An app
message is published by its caller's task, which gets the broker's answer.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import Protocol

import aiormq.exceptions
from aiormq.abc import AbstractChannel, AbstractConnection

from .._core.actions import Republish
from .._core.errors import PublishNotConfirmed
from .._core.listener import ListenerCore
from .._core.step import Step
from .._messages.delivery import DeliveryBase
from .._messages.publish import Outgoing, failure, not_confirmed
from .._telemetry.logs import short
from ._amqp import CHANNEL_GONE, ChannelNumbers, WireProperties, confirmed_publish, publish_copy
from .settling import ChannelSettler

log = logging.getLogger("ackkit")


class PublisherHost(Protocol):
    """What an AsyncPublisher needs from the runtime that owns it: its connection."""

    @property
    def loop(self) -> asyncio.AbstractEventLoop: ...
    @property
    def amqp(self) -> AbstractConnection | None: ...
    @property
    def numbers(self) -> ChannelNumbers: ...


class AsyncPublisher:
    """A confirm-mode channel for republishes (retry delays, dead letters)."""

    def __init__(self, rt: PublisherHost) -> None:
        self.rt = rt
        self.channel: AbstractChannel | None = None
        self.lock = asyncio.Lock()
        self.pending: set[asyncio.Task[None]] = set()
        self.declaring: dict[str, asyncio.Future[None]] = {}

    def submit(self, c: ChannelSettler, a: Republish, original: DeliveryBase) -> None:
        """Publish the copy `a` of `original` (a task); the core is told the outcome."""
        task = self.rt.loop.create_task(self._publish(c, a, original))
        self.pending.add(task)
        task.add_done_callback(self.pending.discard)

    async def _channel(self) -> AbstractChannel:
        async with self.lock:
            ch = self.channel
            if ch is None or ch.is_closed:
                conn = self.rt.amqp
                if conn is None or conn.is_closed:
                    raise ConnectionError("not connected")
                ch = await conn.channel(self.rt.numbers.take(), publisher_confirms=True)
                self.channel = ch
            return ch

    async def send(self, msg: Outgoing) -> None:
        """Publish an app message and wait for the broker's answer; PublishError if it
        was not confirmed. The channel is shared by every handler: when another
        publish's error closed it before this message was written, the message goes on
        the next channel (as on App), within its timeout."""
        deadline = self.rt.loop.time() + msg.timeout
        while True:
            try:
                ch = await self._channel()
            except (TimeoutError, *CHANNEL_GONE) as exc:
                raise not_confirmed(msg, f"not published: {short(exc)}") from None
            try:
                await carry(ch, msg)
                return
            except Unwritten:
                if self.rt.loop.time() >= deadline:
                    raise

    async def _publish(self, c: ChannelSettler, a: Republish, original: DeliveryBase) -> None:
        step = await self.copy(c.core, a, original)
        if step:
            await c.execute(step)  # a copy sent once more: its original kept
        c.originals.answered(a.token)

    async def copy(self, core: ListenerCore, a: Republish, original: DeliveryBase) -> Step:
        """Publish the copy `a` of `original`, one of `core`'s deliveries, confirmed; what
        the core answers (`ListenerCore.republished`) is the caller's to carry out."""
        ok = unroutable = False
        error: str | None = None
        lost: str | None = None
        try:
            ch = await self._channel()
            if a.declare is not None:
                a = await self._declare(ch, a)
            else:
                pending = self.declaring.get(a.routing_key)
                if pending is not None:  # its queue is being declared: publish after that
                    await asyncio.shield(pending)
            if core.publishable(a.token):  # else its channel closed while we waited
                ok, unroutable, error, lost = await publish_copy(ch, a, original)
        except (TimeoutError, *CHANNEL_GONE) as exc:
            lost = short(exc)
            log.warning("republish to %r failed: %s", a.routing_key, lost)
        except Exception as exc:  # the original must still be settled
            log.exception("republish to %r failed", a.routing_key)
            error = f"{a.purpose} copy not publishable: {short(exc)}"
        return core.republished(a.token, ok, unroutable=unroutable, error=error, lost=lost)

    async def _declare(self, ch: AbstractChannel, a: Republish) -> Republish:
        """Declare the queue a Republish asks for, once at a time per queue; publishes
        to it wait for that declare (frames of concurrent tasks are not ordered)."""
        assert a.declare is not None
        name, args = a.declare
        pending = self.declaring.get(name)
        if pending is not None:
            await asyncio.shield(pending)
            return dataclasses.replace(a, declare=None)
        done = self.declaring[name] = self.rt.loop.create_future()
        try:
            await ch.queue_declare(name, durable=True, arguments=args or None)
        finally:
            done.set_result(None)
            if self.declaring.get(name) is done:
                del self.declaring[name]
        return dataclasses.replace(a, declare=None)


class Unwritten(PublishNotConfirmed):
    """Not confirmed because the channel had closed before the message was written:
    the broker never saw it, so sending it on another channel doubles nothing."""


def closed_by(ch: AbstractChannel) -> str:
    """Why `ch` closed, as the broker or the connection said it ("the channel had
    closed: NOT_FOUND - no exchange ..."), for an error of a publish it never sent."""
    if ch.is_closed:  # else `closing` would be a new observer, left waiting
        closing = ch.closing
        why = None if closing.cancelled() else closing.exception()
        if why is not None:
            return f"the channel had closed: {short(why)}"
    return "the channel had closed"


async def carry(ch: AbstractChannel, msg: Outgoing) -> None:
    """The async carrier: publish a built message on confirm channel `ch` and wait for
    the broker's answer; the PublishError its outcome means (`failure`), if any."""
    try:
        confirmed, returned = await confirmed_publish(
            ch,
            msg.body,
            msg.exchange,
            msg.routing_key,
            WireProperties(msg.properties),
            mandatory=msg.mandatory,
            timeout=msg.timeout,
        )
    except TimeoutError:
        raise not_confirmed(
            msg,
            f"no confirm within {msg.timeout:g} s (is the broker blocking publishers? "
            "a memory or disk alarm)",
        ) from None
    except aiormq.exceptions.ChannelInvalidStateError:
        reason = closed_by(ch)
        raise Unwritten(f"publish to {msg.where} not confirmed: not sent, {reason}") from None
    except CHANNEL_GONE as exc:
        raise not_confirmed(msg, f"the channel closed first: {short(exc)}") from None
    error = failure(msg, confirmed=confirmed, returned=returned)
    if error is not None:
        raise error
