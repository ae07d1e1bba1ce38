"""What `ListenerCore` builds once and hands, as one bundle, to each part that decides.

`Parts` is the listener's shared state: its policy, its report (counters and
observer), its ledger (tags and acks), its confirms (copies awaiting the broker),
the explicit requeues of this process and its two clocks. The deciding parts
(`fates.Fates`, `lost.LostRuns`, `gating.Gating`, `shutdown.Shutdown`) are each
handed this bundle and, beside it, only the other parts they work with; as a
`Part`, each holds what all of them read of it under the same names.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .ledger import Ledger
from .policy import ListenerPolicy
from .report import Report
from .republish import Confirms
from .requeues import Requeues


@dataclass(frozen=True, slots=True)
class Parts:
    """The shared state of one listener, built by `ListenerCore`."""

    policy: ListenerPolicy
    report: Report
    """The counters, and the events the observer wants."""
    ledger: Ledger
    """Channel generations, the tag window and when acks go out."""
    confirms: Confirms
    """Copies awaiting the broker's confirm, and what that settles."""
    requeues: Requeues
    """The explicit requeues of this process (told by the fates, forgiven by the lost runs)."""
    clock: Callable[[], float]
    """Monotonic seconds (timeouts, waits)."""
    wallclock: Callable[[], float]
    """Seconds since the epoch (the times a copy's headers are stamped with)."""


class Part:
    """A deciding part of one listener: what every such part reads of its `Parts`, held
    as its own attributes (read on every delivery, without a lookup in the bundle)."""

    def __init__(self, parts: Parts) -> None:
        self.policy = parts.policy
        self.mode = parts.policy.mode
        self._ledger = parts.ledger
        self._confirms = parts.confirms
        self._report = parts.report
        self._emit = parts.report.emit
