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
    """A queue, exchange or binding that conflicts with what the listeners ask for: an
    existing queue or exchange declared with other arguments or another type, or two
    listeners of one app declaring one exchange differently."""


class ConsumeRefused(AckkitError):
    """The broker refused a listener's consumer for a reason waiting cannot fix (no read
    permission on the queue, another connection's exclusive queue, refused consumer
    arguments, a queue deleted while its listener has declare=False): `start()` raises
    it, or `run()` when it happens later; the message carries the broker's reason."""


class PublishError(AckkitError):
    """A publish the broker did not confirm; the subclass says how it failed."""


class MessageUnroutable(PublishError):
    """The broker returned a mandatory publish: no queue is bound to take it (an exchange
    without a matching binding, or a routing key naming no queue)."""


class PublishNacked(PublishError):
    """The broker refused the publish (basic.nack): e.g. a full queue with
    x-overflow=reject-publish, or an internal error; nothing was stored."""


class PublishNotConfirmed(PublishError):
    """No confirm came within the timeout, or the connection was lost first: the message
    may or may not have been stored (publish again if duplicates are acceptable)."""


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


# Their public names, in tracebacks, logs and the error-type header of dead letters
# (`ackkit.BadPayload`, not the private module that defines it).
for _cls in (
    AckkitError,
    AlreadySettled,
    SettleNotAllowed,
    BadPayload,
    TopologyConflict,
    ConsumeRefused,
    PublishError,
    MessageUnroutable,
    PublishNacked,
    PublishNotConfirmed,
    RequeueMessage,
    RejectMessage,
    RetryLater,
    DeadLetterMessage,
):
    _cls.__module__ = "ackkit"
