"""What an app hands a new runtime: one `Launch` value, built by `AppBase._starting`.

A runtime (the App's `Runtime`, the AsyncApp's `AsyncRuntime`) reads nothing of the
app itself: it is given the settings, the listener specs, the observers for their
cores, the instrument hooks and the topology to declare, all in this value.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .._core.events import Observer
from .._core.exchanges import Plan, plan
from .listener_spec import Instrument, ListenerSpec
from .settings import Settings


@dataclass(frozen=True)
class Launch:
    """Everything a runtime is started with."""

    settings: Settings
    specs: Sequence[ListenerSpec]
    observer: Observer | None = None
    """ackkit's own observer (its log lines), called in place by the listeners' cores."""
    observers: Sequence[Observer] = ()
    """The app's registered observers: they run on a thread of their own
    (`ackkit._telemetry.observers`), off the listeners' locks."""
    instruments: Sequence[Instrument] = ()
    """Called for each listener core the runtime builds (metrics, tracing, `stats()`)."""
    topology: Plan | None = None
    """Exchanges, bindings and the queues no listener consumes: the app's `_plan()`;
    None: the listeners' own queues and bindings (see `exchanges`)."""

    @property
    def exchanges(self) -> Plan:
        """What the runtime declares besides each listener's queue."""
        if self.topology is None:
            return plan((s.queue, s.binds) for s in self.specs)
        return self.topology
