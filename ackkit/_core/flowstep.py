"""The flow gate's answers as values (no I/O): what becomes of a delivery that
arrived (`Admission`), and what a runtime does after a flow decision (`FlowStep`,
which `ListenerCore`'s gating part turns into actions)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from .tracked import Tracked


class Admission(str, Enum):
    """What becomes of a delivery that just arrived."""

    RUN = "run"
    """Its handler may start (after the rate limit's wait)."""
    WAIT = "wait"
    """Held in the gate: it comes back in a later `FlowStep.ready` (or `.returned`)."""
    RETURN = "return"
    """Not consuming now: return it to the queue (`Gating.hold_back`)."""


@dataclass
class FlowStep:
    """What the runtime does after a flow decision, in this order."""

    returned: list[Tracked] = field(default_factory=list)
    """Give these back to the queue (`Gating.hold_back`), unstarted."""
    ready: list[Tracked] = field(default_factory=list)
    """Their handlers may start now (queue them to run)."""
    consume: bool | None = None
    """True: (re)open the consumer if there is none; False: cancel it; None: no change."""

    def __bool__(self) -> bool:
        return bool(self.returned or self.ready or self.consume is not None)
