"""The settlement lifecycle, as events and counters."""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum


class Stage(str, Enum):
    """Where a delivery is in its lifecycle."""

    RECEIVED = "received"
    """Delivered to the consumer."""
    ACKED = "acked"
    """Settled as processed (the ack may still be batched)."""
    NACKED = "nacked"
    """Negatively acknowledged by the handler (basic.nack)."""
    REQUEUED = "requeued"
    """Put back on its queue (requeue=True)."""
    REJECTED = "rejected"
    """Rejected without requeue: to the queue's DLX, or dropped when it has none."""
    RETRYING = "retrying"
    """Failed, another attempt is scheduled (in process, or in a delay queue)."""
    DEAD_LETTERED = "dead_lettered"
    """The dead letter's copy was confirmed by the broker (it is in the dead-letter
    queue), and the original acked."""
    DROPPED_STALE = "dropped_stale"
    """A settle for a channel that has closed since: not sent (the broker requeued it)."""
    UNSETTLED = "unsettled"
    """A MANUAL/CLIENT handler returned without settling; the default was applied."""
    RETURNED = "returned"
    """Prefetched but never started (shutdown, pause, a tripped breaker): requeued, not
    counted as a failure."""
    PAUSED = "paused"
    """The listener was paused by hand, or because the broker refuses its copies
    (FlowState.REFUSED): its consumer cancelled (a listener-level event: tag 0,
    attempt 0; the reason says which)."""
    RESUMED = "resumed"
    """A paused listener was resumed by hand, or consumes again after a refusal's wait
    (listener-level)."""
    TRIPPED = "tripped"
    """The circuit breaker tripped: consumer cancelled, held deliveries returned
    (listener-level; the reason says why)."""
    PROBING = "probing"
    """The breaker's wait is over: consuming again with a few probe deliveries
    (listener-level)."""
    RECOVERED = "recovered"
    """The probes succeeded: the breaker closed, the listener consumes as before; or the
    broker confirmed a copy to a destination that had refused them (listener-level)."""
    THROTTLED = "throttled"
    """A handler start waited for the listener's rate limit (listener-level)."""
    COPY_REFUSED = "copy_refused"
    """The broker refused a retry, dead-letter or restamp copy (basic.nack, a return, a
    403 channel close): the original went back to its queue (not counted as an attempt)
    or, for a restamp copy, ran without it; never dropped."""
    CONSUMER_CANCELLED = "consumer_cancelled"
    """The broker cancelled the listener's consumer (basic.cancel: RabbitMQ 4.3's consumer
    timeout, a deleted queue): counted once per cancel; the listener consumes again on a
    new channel and the old deliveries' settles are dropped (DROPPED_STALE)."""
    DUPLICATE = "duplicate"
    """An inbox listener's delivery whose key its inbox had recorded already: acked
    without running the handler (`ackkit.inbox.Inbox`)."""


@dataclass(frozen=True, slots=True)
class Event:
    """One step of one delivery's lifecycle."""

    stage: Stage
    listener: str
    tag: int
    attempt: int
    reason: str = ""
    message_id: str | None = None


Observer = Callable[[Event], None]
"""Called with every Event. An observer with a false `hot` attribute is not called for
RECEIVED, ACKED and THROTTLED (up to one of each per healthy message): watching failures
then costs a healthy message nothing."""

FLOW_STAGES = frozenset(
    {Stage.PAUSED, Stage.RESUMED, Stage.TRIPPED, Stage.PROBING, Stage.RECOVERED, Stage.THROTTLED}
)
"""Listener-level stages: their events carry tag 0 and attempt 0."""

HOT_STAGES = frozenset({Stage.RECEIVED, Stage.ACKED, Stage.THROTTLED})

FRAME_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000)
"""Upper bounds of the ack frame size histogram (deliveries settled by one basic.ack)."""


class Counters:
    """Per-listener counts of lifecycle stages, plus ack frames sent and their size."""

    __slots__ = ("ack_frames", "acked_by_frames", "counts", "frame_sizes")

    def __init__(self) -> None:
        self.counts: dict[Stage, int] = dict.fromkeys(Stage, 0)
        self.ack_frames = 0
        self.acked_by_frames = 0
        # frame_sizes[i]: ack frames of at most FRAME_BUCKETS[i] deliveries (and more than
        # the bound before); the last slot counts the larger ones.
        self.frame_sizes = [0] * (len(FRAME_BUCKETS) + 1)

    def ack_frame(self, n: int) -> None:
        """One basic.ack frame was decided, settling `n` deliveries."""
        self.ack_frames += 1
        self.acked_by_frames += n
        self.frame_sizes[bisect_left(FRAME_BUCKETS, n)] += 1

    def snapshot(self) -> dict[str, int]:
        out = {s.value: n for s, n in self.counts.items()}
        out["ack_frames"] = self.ack_frames
        return out
