"""The AsyncConsumer's side of flow control: carry out `Consume`, and pause by hand.

Pause, circuit breaker, rate limit and per-key serial mode are decided by the
listener's core (`_core.gating`): its answers carry a `Consume` (hold a
consumer or not) before the returns it decides, and a `Run` for each delivery
the gate lets through. This module only does the aiormq part of a `Consume`:
basic.consume, or basic.cancel and giving back what waits in the backlog.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

from ._amqp import CHANNEL_GONE

if TYPE_CHECKING:
    from aiormq.abc import AbstractChannel

    from .._messages.delivery import DeliveryBase
    from .consumer import AsyncConsumer, Unit

CANCEL_TIMEOUT = 5.0


async def switch(c: AsyncConsumer, on: bool) -> None:
    """A `Consume` action (run by the settler, holding its lock): hold a consumer on the
    queue, or cancel it and give back what waits in the backlog."""
    ch = c.channel
    if ch is None or ch.is_closed or c.rt.stopping:
        return
    if c.core.gating.consuming:  # what the core says now (see the App's `flowing.switch`)
        if c.consumer_tag is None and not c.consuming:
            c.rt.spawn(_consume(c, ch))  # its answer is awaited outside the settle lock
        return
    tag = c.consumer_tag
    if tag is not None:
        c.consumer_tag = None
        with contextlib.suppress(*CHANNEL_GONE, TimeoutError):
            await ch.basic_cancel(tag, timeout=CANCEL_TIMEOUT)
    await _return_backlog(c)


async def _consume(c: AsyncConsumer, ch: AbstractChannel) -> None:
    idle = c.consumer_tag is None and not c.consuming
    if (
        ch is c.channel
        and not ch.is_closed
        and idle
        and c.core.gating.consuming
        and not c.rt.stopping
    ):
        await c.consume(ch)


async def _return_backlog(c: AsyncConsumer) -> None:
    """Deliveries waiting for a free slot go back now (those the core says may no longer
    start); the rest stay queued."""
    units: list[Unit] = list(c.backlog)
    if not units:
        return
    ds = [d for u in units for d in (u if isinstance(u, list) else [u])]
    keep, acts = c.core.gating.withdraw([d._tracked for d in ds])
    if not acts:
        return
    stay = {id(t) for t in keep}
    c.backlog.clear()
    for u in units:
        kept = [d for d in (u if isinstance(u, list) else [u]) if id(d._tracked) in stay]
        if kept:
            c.backlog.append(kept if isinstance(u, list) else kept[0])
    await c._execute(acts)  # the settle lock is held already


async def set_paused(c: AsyncConsumer, paused: bool) -> None:
    """Pause or resume the listener by hand."""
    acts = c.core.gating.set_paused(paused)
    if acts:
        await c.execute(acts)


def waiting(c: AsyncConsumer) -> list[DeliveryBase]:
    """Shutdown: the deliveries the gate holds, and the restamp copies the core holds
    (returned with the unstarted)."""
    ts = c.core.shutdown.take_held()
    held = (c.originals.get(t.generation, t.tag) for t in ts)
    return [d for d in held if d is not None]
