"""What a listener tells: its counters, and the events its observer wants.

`Report` is the part of `ListenerCore` every other part is handed to count a
stage and tell the observer of it: a delivery's (`emit`), or the listener's
own, such as paused or tripped (`listener_event`). RECEIVED and ACKED happen
once per healthy message: they reach only an observer that wants them (`hot`).
"""

from __future__ import annotations

from .events import HOT_STAGES, Counters, Event, Observer, Stage
from .tracked import Tracked


class Report:
    """Counts and tells the events of one listener (named `name`)."""

    __slots__ = ("counters", "hot", "name", "observer")

    def __init__(self, name: str, counters: Counters, observer: Observer | None) -> None:
        self.name = name
        self.counters = counters
        self.observer = observer
        self.hot = observer is not None and getattr(observer, "hot", True)
        """The observer wants RECEIVED and ACKED too (see `Observer`)."""

    def emit(self, stage: Stage, t: Tracked, reason: str, count: bool = True) -> None:
        """`t` reached `stage` (why: `reason`): counted (unless `count` is False), told."""
        if count:
            self.counters.counts[stage] += 1
        if self.observer and (self.hot or stage not in HOT_STAGES):
            self.observer(Event(stage, self.name, t.tag, t.attempt, reason, t.message_id))

    def listener_event(self, stage: Stage, reason: str) -> None:
        """The listener's own events (paused, tripped, throttled): counted, told."""
        self.counters.counts[stage] += 1
        if self.observer and (self.hot or stage not in HOT_STAGES):
            self.observer(Event(stage, self.name, 0, 0, reason))
