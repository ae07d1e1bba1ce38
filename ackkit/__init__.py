"""ackkit: RabbitMQ consumer acknowledgement, correct by construction.

Public names are re-exported here; everything in underscore modules is private.
"""

from ._core.errors import (
    AckkitError,
    AlreadySettled,
    BadPayload,
    DeadLetterMessage,
    RejectMessage,
    RequeueMessage,
    RetryLater,
    SettleNotAllowed,
    TopologyConflict,
)
from ._core.events import Event, Stage
from ._core.policy import AckMode, FlushPolicy, Retry, RetryStrategy, Unsettled
from ._delivery import Delivery
from ._handler import AckIndex
from ._sync.app import App
from ._sync.pull import PullConnection, connect
from ._url import mask_url

__version__ = "0.1.0"

__all__ = [
    "AckIndex",
    "AckMode",
    "AckkitError",
    "AlreadySettled",
    "App",
    "BadPayload",
    "DeadLetterMessage",
    "Delivery",
    "Event",
    "FlushPolicy",
    "PullConnection",
    "RejectMessage",
    "RequeueMessage",
    "Retry",
    "RetryLater",
    "RetryStrategy",
    "SettleNotAllowed",
    "Stage",
    "TopologyConflict",
    "Unsettled",
    "__version__",
    "connect",
    "mask_url",
]
