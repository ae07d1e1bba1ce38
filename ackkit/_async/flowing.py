"""The AsyncConsumer's side of flow control: carry out what the core's gate decides.

Pause, circuit breaker, rate limit and per-key serial mode are decided by
`ListenerCore.flow` (`_core.gate.Flow`); this module only does what a
`FlowStep` says on aiormq: start deliveries (a free concurrency slot, or the
backlog), return deliveries (`ListenerCore.hold_back`, basic.nack requeue) once
the consumer is cancelled, and cancel or re-open the consumer.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

from .._core.gate import Admission, FlowStep
from ._amqp import CHANNEL_GONE

if TYPE_CHECKING:
    from .._core.tracked import Tracked
    from .._delivery import DeliveryBase
    from .consumer import AsyncConsumer

CANCEL_TIMEOUT = 5.0


async def admit(c: AsyncConsumer, d: DeliveryBase) -> bool:
    """A delivery arrived: may its handler run now? If not, the gate holds it, or it
    goes back to the queue."""
    flow = c.core.flow
    props = d.properties
    how = flow.arrive(d._tracked, flow.key(props.headers, props, d.routing_key))
    if how is Admission.RETURN:
        await give_back(c, [d._tracked])
    return how is Admission.RUN


async def before_start(c: AsyncConsumer, ds: list[DeliveryBase]) -> list[DeliveryBase]:
    """A handler is about to run for `ds`: wait for the rate limit, then keep only the
    ones the gate still lets start (the others go back to the queue)."""
    flow = c.core.flow
    if flow.bucket is not None:
        wait = flow.reserve(len(ds))
        if wait > 0:
            await c.rt.pause(wait)  # cut short when the app stops
            ds = await c._startable(ds)  # a stopping core releases them instead
            if not ds:
                return []
    if not flow.gated:
        return ds
    back = [d for d in ds if not flow.may_start(d._tracked)]
    if not back:
        return ds
    step = flow.done([d._tracked for d in back], None)
    step.returned[:0] = [d._tracked for d in back]
    await carry_out(c, step)
    return [d for d in ds if d not in back]


async def carry_out(c: AsyncConsumer, step: FlowStep) -> None:
    """Do what the gate decided: the consumer first, then the returns, then the starts."""
    if step.consume is not None:
        await reconcile(c)
    if step.returned:
        await give_back(c, step.returned)
    for t in step.ready:
        d = c.originals.get(t.generation, t.tag)
        if d is not None:
            c.start(d)


async def give_back(c: AsyncConsumer, ts: list[Tracked]) -> None:
    """Return deliveries unstarted, after the consumer is cancelled (a requeue the broker
    sees before the cancel would come straight back to this consumer)."""
    await reconcile(c)
    core = c.core
    why = core.flow.state.value
    for t in ts:
        acts = core.hold_back(t, why)
        if acts:
            await c.execute(t.generation, acts)


async def reconcile(c: AsyncConsumer) -> None:
    """Hold a consumer on the queue exactly when the gate says so; when it goes, return
    what waits in the backlog."""
    ch = c.channel
    if ch is None or ch.is_closed or c.rt.stopping:
        return
    if c.core.flow.consuming:
        if c.consumer_tag is None and not c.consuming:
            await c.consume(ch)
        return
    tag = c.consumer_tag
    if tag is not None:
        c.consumer_tag = None
        with contextlib.suppress(*CHANNEL_GONE, TimeoutError):
            await ch.basic_cancel(tag, timeout=CANCEL_TIMEOUT)
    await _return_backlog(c)


async def _return_backlog(c: AsyncConsumer) -> None:
    flow = c.core.flow
    units = list(c.backlog)
    c.backlog.clear()
    back: list[DeliveryBase] = []
    for u in units:
        ds = u if isinstance(u, list) else [u]
        if all(flow.may_start(d._tracked) for d in ds):
            c.backlog.append(u)
        else:
            back.extend(ds)
    if back:
        step = flow.done([d._tracked for d in back], None)
        step.returned[:0] = [d._tracked for d in back]
        await carry_out(c, step)


async def set_paused(c: AsyncConsumer, paused: bool) -> None:
    """Pause or resume the listener by hand."""
    flow = c.core.flow
    step = flow.pause() if paused else flow.resume()
    if step:
        await carry_out(c, step)


async def tick(c: AsyncConsumer) -> None:
    """Periodically: a tripped breaker whose wait is over starts probing."""
    step = c.core.flow.tick()
    if step:
        await carry_out(c, step)


def waiting(c: AsyncConsumer) -> list[DeliveryBase]:
    """Shutdown: the deliveries the gate holds, and the restamp copies the core holds
    (returned with the unstarted)."""
    ts = c.core.flow.drain() if c.core.flow.active else []
    ts.extend(c.core.take_held())
    held = (c.originals.get(t.generation, t.tag) for t in ts)
    return [d for d in held if d is not None]
