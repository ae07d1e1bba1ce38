"""Errors ackkit raises, and the signals a handler may raise to steer the outcome."""

from __future__ import annotations


class AckkitError(Exception):
    """Base class of ackkit's own errors."""


class AlreadySettled(AckkitError):
    """A delivery was acked / nacked / rejected a second time."""


class SettleNotAllowed(AckkitError):
    """The listener's ack mode does not allow this settle (e.g. AckMode.NONE)."""


class BadPayload(AckkitError):
    """A body that cannot be decoded or validated: never retried, dead-lettered with its reason."""


class TopologyConflict(AckkitError):
    """An existing queue was declared with arguments that conflict with ackkit's."""


class Signal(Exception):
    """Base of the exceptions a handler raises to choose an outcome explicitly."""

    reason: str = ""


class RequeueMessage(Signal):
    """Put the delivery back on its queue now (counts as an attempt)."""

    def __init__(self, reason: str = "requeue requested") -> None:
        super().__init__(reason)
        self.reason = reason


class RejectMessage(Signal):
    """Reject without requeue: to the queue's DLX if it has one, else dropped (logged)."""

    def __init__(self, reason: str = "rejected by handler") -> None:
        super().__init__(reason)
        self.reason = reason


class RetryLater(Signal):
    """Retry later (RocketMQ's RECONSUME_LATER), within the listener's max attempts.

    `delay` overrides the policy's backoff for this attempt.
    """

    def __init__(self, reason: str = "retry requested", delay: float | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.delay = delay


class DeadLetterMessage(Signal):
    """Give up on this message now: dead-letter it with `reason`."""

    def __init__(self, reason: str = "dead-lettered by handler") -> None:
        super().__init__(reason)
        self.reason = reason
