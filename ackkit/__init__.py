"""ackkit: RabbitMQ consumer acknowledgement, correct by construction.

Public names are re-exported here; everything in underscore modules is private.
"""

import importlib
from typing import TYPE_CHECKING, Any

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
from ._core.events import Event, Stage
from ._core.exchanges import Bind, Exchange, ExchangeType
from ._core.flow import CircuitBreaker, FlowState, KeySource, RateLimit, SerialKey
from ._core.policy import AckMode, FlushPolicy, Retry, RetryStrategy, Unsettled
from ._dead_letters import DeadLetter, ReplayFilter, ReplayReport
from ._delivery import Delivery
from ._dlq import DeadLetterQueue, inspect_dead_letters, replay_dead_letters
from ._handler import AckIndex
from ._listener_values import Batch, Consumer, Flow, Queue
from ._sync.app import App
from ._sync.pull import PullConnection, connect
from ._tls import TLS
from ._url import mask_url

if TYPE_CHECKING:
    from ._async.app import AsyncApp
    from ._async.delivery import AsyncDelivery
    from ._async.pull import AsyncPullConnection, aconnect

__version__ = "0.1.0"

# The asyncio runtime needs aio-pika, an optional extra: imported on first use.
_ASYNC = {
    "AsyncApp": "app",
    "AsyncDelivery": "delivery",
    "AsyncPullConnection": "pull",
    "aconnect": "pull",
}
_ASYNC_HINT = 'pip install "ackkit[async]"'


def __getattr__(name: str) -> Any:
    mod = _ASYNC.get(name)
    if mod is None:
        raise AttributeError(f"module 'ackkit' has no attribute {name!r}")
    try:
        module = importlib.import_module(f"ackkit._async.{mod}")
    except ImportError as exc:
        if exc.name not in ("aio_pika", "aiormq", "pamqp", "yarl"):
            raise
        raise ImportError(
            f"ackkit.{name} needs aio-pika, which is not installed: {_ASYNC_HINT}", name=exc.name
        ) from exc
    value = getattr(module, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_ASYNC))


__all__ = [  # noqa: RUF022 - plain sorted() order, see tests/unit/test_public_api.py
    "Queue",
    "Flow",
    "Consumer",
    "Batch",
    "AckIndex",
    "AckMode",
    "AckkitError",
    "AlreadySettled",
    "App",
    "AsyncApp",
    "AsyncDelivery",
    "AsyncPullConnection",
    "BadPayload",
    "Bind",
    "CircuitBreaker",
    "ConsumeRefused",
    "DeadLetter",
    "DeadLetterMessage",
    "DeadLetterQueue",
    "Delivery",
    "Event",
    "Exchange",
    "ExchangeType",
    "FlowState",
    "FlushPolicy",
    "KeySource",
    "MessageUnroutable",
    "PublishError",
    "PublishNacked",
    "PublishNotConfirmed",
    "PullConnection",
    "RateLimit",
    "RejectMessage",
    "ReplayFilter",
    "ReplayReport",
    "RequeueMessage",
    "Retry",
    "RetryLater",
    "RetryStrategy",
    "SerialKey",
    "SettleNotAllowed",
    "Stage",
    "TLS",
    "TopologyConflict",
    "Unsettled",
    "__version__",
    "aconnect",
    "connect",
    "inspect_dead_letters",
    "mask_url",
    "replay_dead_letters",
]
