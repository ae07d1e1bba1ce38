"""One registered listener (`ListenerSpec`) and the instrument probes a runtime wraps
around its handler; moved out of `spec.py`, which re-exports them."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .._core.consume import Consuming
from .._core.events import Observer
from .._core.exchanges import Bind
from .._core.listener import ListenerCore
from .._core.policy import ListenerPolicy
from .handler import Binding

if TYPE_CHECKING:
    from .._messages.delivery import DeliveryBase
    from ..inbox import Inbox
    from .invocation import HandlerDone, HandlerProbe
    from .listener_values import Publication


@dataclass(frozen=True)
class ListenerSpec:
    """One registered listener: its policy, its handler binding and how it runs."""

    policy: ListenerPolicy
    binding: Binding
    concurrency: int = 1
    batch_size: int | None = None
    batch_timeout: float = 0.2
    declare: bool = True
    queue_arguments: dict[str, Any] = field(default_factory=dict)
    binds: tuple[Bind, ...] = ()
    consumer_arguments: dict[str, Any] = field(default_factory=dict)
    """basic.consume arguments (x-priority, x-consumer-timeout, ...)."""
    exclusive: bool = False
    """basic.consume exclusive: no other consumer on the queue while this one is."""
    inbox: Inbox | None = None
    """Exactly-once database effects: the handler runs in the inbox's transaction."""
    publishes: tuple[Publication, ...] = ()
    """What the handler publishes, for the AsyncAPI document (`ackkit docs`)."""

    @property
    def single_active(self) -> bool:
        """Is the queue declared with x-single-active-consumer? (Then a consumer that
        receives nothing may simply be the standby, which is not an error.)"""
        return bool(self.queue_arguments.get("x-single-active-consumer"))

    @property
    def name(self) -> str:
        return self.policy.name

    @property
    def queue(self) -> str:
        return self.policy.queue

    def consumer_core(self, observer: Observer | None) -> ListenerCore:
        """The core of this listener as an app's consumer runs it: it holds a restamp
        copy that overtakes its original's ack, counts an inbox's duplicates, and
        carries out the flow gate's `Consume` and `Run` itself."""
        return ListenerCore(
            self.policy,
            observer=observer,
            hold_early_copies=True,
            dedup=self.inbox is not None,
            gated=True,
        )

    def consuming(self, core: ListenerCore) -> Consuming:
        """What a refused or cancelled consumer of this listener comes to (the core's
        `Consuming`, on the flow gate of `core`, the one `consumer_core` built)."""
        return Consuming(
            core.gating.flow,
            self.name,
            self.queue,
            declare=self.declare,
            exclusive=self.exclusive,
        )


Instrument = Callable[[ListenerSpec, "ListenerCore"], "HandlerProbe | None"]
"""Called when a runtime has built a listener's core: the handler probe for it, or None."""


def _combine(probes: Sequence[HandlerProbe]) -> HandlerProbe:
    if len(probes) == 1:
        return probes[0]

    def start(ds: Sequence[DeliveryBase]) -> HandlerDone:
        dones = [p(ds) for p in probes]

        def done(exc: BaseException | None) -> None:
            for d in reversed(dones):
                d(exc)

        return done

    return start


def probe_for(
    instruments: Sequence[Instrument], spec: ListenerSpec, core: ListenerCore
) -> HandlerProbe | None:
    """The probe a runtime calls around `spec`'s handler: every instrument's, or None."""
    probes = [p for f in instruments if (p := f(spec, core)) is not None]
    return _combine(probes) if probes else None
