"""AsyncDelivery: a Delivery whose ack / nack / reject are coroutines."""

from __future__ import annotations

from typing import Protocol, cast

from .._delivery import Delivery


class AsyncSettler(Protocol):
    """What the asyncio runtime offers an AsyncDelivery to carry out a handler's settle."""

    async def asettle(
        self, delivery: Delivery, kind: str, requeue: bool, multiple: bool
    ) -> None: ...


class AsyncDelivery(Delivery):
    """A delivery on the asyncio runtime: `await delivery.ack()`.

    It is a Delivery (handlers annotated `Delivery` receive it), but its settle
    methods are coroutines: the decision is made by the listener's core at call
    time (so AlreadySettled is raised by the `await`), and the frame is sent on
    the channel the delivery came from, or not at all if that channel is gone.
    Plain `def` handlers on an AsyncApp receive a plain `Delivery` whose
    blocking `ack()` hands the settle to the event loop and waits for it.
    """

    __slots__ = ()

    async def ack(self, multiple: bool = False) -> None:  # type: ignore[override]
        """Acknowledge (processed). multiple=True also acks every earlier delivery."""
        await self._asettler.asettle(self, "ack", False, multiple)

    async def nack(self, requeue: bool = True, multiple: bool = False) -> None:  # type: ignore[override]
        """Negative ack. requeue=False dead-letters (to the listener's DLQ if it has one)."""
        await self._asettler.asettle(self, "nack", requeue, multiple)

    async def reject(self, requeue: bool = False) -> None:  # type: ignore[override]
        """Reject one delivery. requeue=False dead-letters (to the DLQ if there is one)."""
        await self._asettler.asettle(self, "reject", requeue, False)

    @property
    def _asettler(self) -> AsyncSettler:
        return cast(AsyncSettler, self._settler)

    def __repr__(self) -> str:
        return "<Async" + super().__repr__()[1:]
