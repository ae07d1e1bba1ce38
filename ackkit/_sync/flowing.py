"""The App consumer's side of flow control: carry out `Consume`, and pause by hand.

Pause, circuit breaker, rate limit and per-key serial mode are decided by the
listener's core (`_core.gating`): its answers carry a `Consume` (hold a
consumer or not) before the returns it decides, and a `Run` for each delivery
the gate lets through. This module only does the pika part of a `Consume` on
the I/O thread: basic.consume, or basic.cancel and giving back what waits in
the worker inbox.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from .host import OnChannel

if TYPE_CHECKING:
    from .._core.step import Step
    from .._interpreter.originals import Originals
    from .._messages.delivery import Delivery
    from .handoff import Handoff


class _Stopping(Protocol):
    """What this module reads of the runtime: whether the app is stopping."""

    @property
    def stopping(self) -> bool: ...


class FlowingConsumer(OnChannel, Protocol):
    """What this module uses of the App consumer (`consumer.Consumer`)."""

    @property
    def rt(self) -> _Stopping: ...
    @property
    def inbox(self) -> Handoff[Delivery]: ...
    @property
    def originals(self) -> Originals[Any]: ...

    def send(self, step: Step) -> None: ...
    def _basic_consume(self, ch: Any) -> None: ...


def switch(c: FlowingConsumer, on: bool) -> None:
    """I/O thread (a `Consume` action): hold a consumer on the queue, or cancel it and
    give back what waits in the inbox. What the core says now wins over `on` (what it
    said when it decided): a pause and a resume decided on two threads may be carried
    out in either order, and the consumer ends as the last of them wants."""
    ch = c.channel
    if ch is None or not ch.is_open or c.rt.stopping:
        return
    if c.core.gating.consuming:
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


def _return_inbox(c: FlowingConsumer) -> None:
    """Deliveries waiting for a worker go back now rather than when a worker is free
    (those the core says may no longer start)."""
    waiting = c.inbox.drain()
    with c.lock:
        keep, acts = c.core.gating.withdraw([d._tracked for d in waiting])
        if acts:
            c.send(acts)
    stay = {id(t) for t in keep}
    c.inbox.put_back([d for d in waiting if id(d._tracked) in stay])


def set_paused(c: FlowingConsumer, paused: bool) -> None:
    """Pause or resume the listener by hand (any thread)."""
    with c.lock:
        acts = c.core.gating.set_paused(paused)
        if acts:
            c.send(acts)


def waiting(c: FlowingConsumer) -> list[Delivery]:
    """Shutdown: the deliveries the gate holds, and the restamp copies the core holds
    (they are returned with the unstarted)."""
    with c.lock:
        ts = c.core.shutdown.take_held()
        held = (c.originals.get(t.generation, t.tag) for t in ts)
        return [d for d in held if d is not None]
