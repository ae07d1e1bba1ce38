"""The App consumer's side of flow control: carry out what the core's gate decides.

Pause, circuit breaker, rate limit and per-key serial mode are decided by
`ListenerCore.flow` (`_core.gate.Flow`); this module only does what a
`FlowStep` says on pika: start deliveries (the worker inbox), return deliveries
(`ListenerCore.hold_back`, basic.nack requeue), and cancel or re-open the
consumer on the I/O thread.
"""

from __future__ import annotations

import queue as _queue
from typing import TYPE_CHECKING

from .._core.gate import Admission, FlowStep

if TYPE_CHECKING:
    from .._core.tracked import Tracked
    from .._delivery import Delivery
    from .consumer import Consumer


def admit(c: Consumer, d: Delivery) -> bool:
    """A delivery arrived (I/O thread): may it go to the workers now? If not, the gate
    holds it, or it went back to the queue."""
    flow = c.core.flow
    t = d._tracked
    props = d.properties
    key = flow.key(props.headers, props, d.routing_key)
    with c.lock:
        how = flow.arrive(t, key)
        if how is Admission.RETURN:
            c.queue(t.generation, c.core.hold_back(t, flow.state.value))
    if how is Admission.RETURN:
        # the consumer goes first: a requeue the broker sees before the cancel would
        # come straight back to this consumer
        reconcile(c)
        c.flush()
    return how is Admission.RUN


def before_start(c: Consumer, ds: list[Delivery]) -> list[Delivery]:
    """A worker is about to run `ds`: wait for the rate limit, then keep only the ones
    the gate still lets start (the others go back to the queue)."""
    core = c.core
    flow = core.flow
    if flow.bucket is not None:
        with c.lock:
            wait = flow.reserve(len(ds))
        if wait > 0:
            c.rt.stop_event.wait(wait)  # cut short when the app stops
            with c.lock:
                ds = c._startable(ds)  # a stopping core releases them instead
            if not ds:
                return []
    if not flow.gated:
        return ds
    with c.lock:
        back = [d for d in ds if not flow.may_start(d._tracked)]
        if not back:
            return ds
        step = flow.done([d._tracked for d in back], None)
        step.returned[:0] = [d._tracked for d in back]
    carry_out(c, step)
    return [d for d in ds if d not in back]


def carry_out(c: Consumer, step: FlowStep) -> None:
    """Do what the gate decided (any thread, not holding the lock). The consumer is
    cancelled before the returns go out (the I/O thread runs its callbacks in order)."""
    if step.consume is not None:
        c.rt.call_soon(lambda: reconcile(c))
    if step.returned:
        ts = list(step.returned)
        c.rt.call_soon(lambda: _give_back(c, ts))
    for t in step.ready:
        d = c.originals.get(t.generation, t.tag)
        if d is not None:
            c.inbox.put(d)


def _give_back(c: Consumer, ts: list[Tracked]) -> None:
    """I/O thread: return deliveries, after the consumer is cancelled (a requeue the
    broker sees before the cancel would come straight back to this consumer)."""
    reconcile(c)
    why = c.core.flow.state.value
    with c.lock:
        for t in ts:
            acts = c.core.hold_back(t, why)
            if acts:
                c.queue(t.generation, acts)
    c.flush()


def reconcile(c: Consumer) -> None:
    """I/O thread: hold a consumer on the queue exactly when the gate says so; when it
    goes, return what waits in the inbox."""
    ch = c.channel
    if ch is None or not ch.is_open or c.rt.stopping:
        return
    if c.core.flow.consuming:
        if c.consumer_tag is None:
            c._basic_consume(ch)
        return
    tag = c.consumer_tag
    if tag is not None:
        ch.basic_cancel(tag, callback=lambda _frame: None)  # keeps it registered until CancelOk
        # pika would reject (requeue) a delivery that crosses the cancel on the wire
        # behind the core's back, and its redelivery would count as an attempt; until
        # CancelOk it reaches our callback instead, which returns it through the core.
        cancelled = getattr(ch, "_cancelled", None)
        if isinstance(cancelled, set):
            cancelled.discard(tag)
        c.consumer_tag = None
    _return_inbox(c)


def _return_inbox(c: Consumer) -> None:
    """Deliveries waiting for a worker go back now rather than when a worker is free."""
    keep: list[Delivery | None] = []
    back: list[Delivery] = []
    while True:
        try:
            d = c.inbox.get_nowait()
        except _queue.Empty:
            break
        if d is not None and not c.core.flow.may_start(d._tracked):
            back.append(d)
        else:
            keep.append(d)
    for x in keep:
        c.inbox.put(x)
    if back:
        with c.lock:
            step = c.core.flow.done([d._tracked for d in back], None)
            step.returned[:0] = [d._tracked for d in back]
        carry_out(c, step)


def set_paused(c: Consumer, paused: bool) -> None:
    """Pause or resume the listener by hand (any thread)."""
    flow = c.core.flow
    with c.lock:
        step = flow.pause() if paused else flow.resume()
    if step:
        carry_out(c, step)


def waiting(c: Consumer) -> list[Delivery]:
    """Shutdown: the deliveries the gate holds, and the restamp copies the core holds
    (they are returned with the unstarted)."""
    with c.lock:
        ts = c.core.flow.drain() if c.core.flow.active else []
        ts.extend(c.core.take_held())
        held = (c.originals.get(t.generation, t.tag) for t in ts)
        return [d for d in held if d is not None]
