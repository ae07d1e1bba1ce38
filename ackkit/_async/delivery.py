"""AsyncDelivery: a delivery whose ack / nack / reject / publish are coroutines."""

from __future__ import annotations

from typing import Any, Protocol, cast

from .._messages.delivery import DeliveryBase
from .._messages.publish import Outgoing, apublishes, reply


class AsyncSettler(Protocol):
    """What the asyncio runtime offers an AsyncDelivery to carry out a handler's settle."""

    async def _asettle(
        self, delivery: DeliveryBase, kind: str, requeue: bool, multiple: bool
    ) -> None: ...


class AsyncMessagePublisher(Protocol):
    """What the asyncio runtime offers an AsyncDelivery to publish."""

    async def apublish_message(self, msg: Outgoing) -> None: ...


class AsyncDelivery(DeliveryBase):
    """A delivery on the asyncio runtime: `await delivery.ack()`.

    A sibling of `Delivery` (the same read-only parts, from `DeliveryBase`) whose
    settle and publish methods are coroutines: the decision is made by the listener's
    core at call time (so AlreadySettled is raised by the `await`), and the frame is
    sent on the channel the delivery came from, or not at all if that channel is gone.
    `async def` handlers on an AsyncApp receive it (annotated `AsyncDelivery`, or
    `Delivery` as before); plain `def` handlers receive a `Delivery` whose blocking
    `ack()` hands the settle to the event loop and waits for it.
    """

    __slots__ = ()

    async def ack(self, multiple: bool = False) -> None:
        """Acknowledge (processed). multiple=True also acks every earlier delivery."""
        await self._asettler._asettle(self, "ack", False, multiple)

    async def nack(self, requeue: bool = True, multiple: bool = False) -> None:
        """Negative ack. requeue=False dead-letters (to the listener's DLQ if it has one)."""
        await self._asettler._asettle(self, "nack", requeue, multiple)

    async def reject(self, requeue: bool = False) -> None:
        """Reject one delivery. requeue=False dead-letters (to the DLQ if there is one)."""
        await self._asettler._asettle(self, "reject", requeue, False)

    @apublishes
    async def publish(self, msg: Outgoing) -> None:
        """Publish a message on the connection this delivery came from, and wait for the
        broker's confirm."""
        await self._apublisher().apublish_message(msg)

    async def reply(self, body: object, **options: Any) -> None:
        """Publish `body` to this delivery's `reply_to` queue with its correlation_id (its
        message_id when it has none), confirmed; ValueError when it has no reply_to."""
        await self._apublisher().apublish_message(reply(self, body, **options))

    def _apublisher(self) -> AsyncMessagePublisher:
        if not hasattr(self._settler, "apublish_message"):
            raise TypeError(f"{self!r} cannot publish: its source offers no publisher")
        return cast(AsyncMessagePublisher, self._settler)

    @property
    def _asettler(self) -> AsyncSettler:
        return cast(AsyncSettler, self._settler)
