"""Every exception ackkit raises, and the signals a handler raises to choose its
message's outcome (the signals are at the package root as well).

`AckkitError` is the base of ackkit's errors; publishing fails with a `PublishError`
(`PublishNacked`, `PublishNotConfirmed`, `MessageUnroutable`); a body that cannot be
read is a `BadPayload`.
"""

from ._core.errors import (
    AckkitError,
    AlreadySettled,
    BadPayload,
    ConsumeRefused,
    DeadLetterMessage,
    MessageUnroutable,
    PublishError,
    PublishNacked,
    PublishNotConfirmed,
    RejectMessage,
    RequeueMessage,
    RetryLater,
    SettleNotAllowed,
    TopologyConflict,
)

__all__ = [
    "AckkitError",
    "AlreadySettled",
    "BadPayload",
    "ConsumeRefused",
    "DeadLetterMessage",
    "MessageUnroutable",
    "PublishError",
    "PublishNacked",
    "PublishNotConfirmed",
    "RejectMessage",
    "RequeueMessage",
    "RetryLater",
    "SettleNotAllowed",
    "TopologyConflict",
]
