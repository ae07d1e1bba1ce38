"""ackkit: RabbitMQ consumer acknowledgement, correct by construction.

The root holds the app and its listeners: `App` / `AsyncApp`, the values `listener()`
takes (`Queue`, `Consumer`, `Batch`, `Flow`, `Publication`, `Retry`, ...), what a handler receives
(`Delivery` / `AsyncDelivery`) and the signals it may raise or return, and pull mode's
`connect` / `aconnect`. The rest is grouped by purpose in public submodules:
`ackkit.errors`, `ackkit.flow`, `ackkit.topology`, `ackkit.dead_letters`,
`ackkit.observability`, `ackkit.pull` (and `ackkit.inbox`, `ackkit.metrics`,
`ackkit.tracing`, `ackkit.testing`, `ackkit.spark`). Everything in underscore modules is
private.
"""

import importlib
import sys
import warnings
from typing import TYPE_CHECKING, Any

from . import _async, dead_letters, errors, flow, observability, pull, topology  # noqa: F401
from ._app.handler import AckIndex
from ._app.listener_values import Batch, Consumer, Flow, Publication, Queue
from ._connection.tls import TLS
from ._core.errors import DeadLetterMessage, RejectMessage, RequeueMessage, RetryLater
from ._core.policy import AckMode, FlushPolicy, Retry, RetryStrategy, Unsettled
from ._messages.delivery import Delivery
from ._sync.app import App
from ._sync.pull import connect

if TYPE_CHECKING:
    from ._async.app import AsyncApp
    from ._async.delivery import AsyncDelivery
    from ._async.pull import aconnect

__version__ = "0.1.0"


# Names the root held in 0.1, now in a submodule: they still work from the root, with a
# DeprecationWarning, until 0.3.
_MOVED = {
    **dict.fromkeys(
        (
            "AckkitError",
            "AlreadySettled",
            "BadPayload",
            "ConsumeRefused",
            "MessageUnroutable",
            "PublishError",
            "PublishNacked",
            "PublishNotConfirmed",
            "SettleNotAllowed",
            "TopologyConflict",
        ),
        "errors",
    ),
    **dict.fromkeys(("CircuitBreaker", "FlowState", "KeySource", "RateLimit", "SerialKey"), "flow"),
    **dict.fromkeys(("Bind", "Exchange", "ExchangeType"), "topology"),
    **dict.fromkeys(
        (
            "DeadLetter",
            "DeadLetterQueue",
            "ReplayFilter",
            "ReplayReport",
            "inspect_dead_letters",
            "replay_dead_letters",
        ),
        "dead_letters",
    ),
    **dict.fromkeys(("Event", "Stage", "mask_url"), "observability"),
    **dict.fromkeys(("PullConnection", "AsyncPullConnection"), "pull"),
}


def __getattr__(name: str) -> Any:
    where = _MOVED.get(name)
    if where is not None:
        # `from ackkit import X` asks twice: importlib's hasattr(), then the import
        # statement itself; warn once, at the statement.
        if sys._getframe(1).f_code.co_filename != "<frozen importlib._bootstrap>":
            warnings.warn(
                f"ackkit.{name} is deprecated, use ackkit.{where}.{name}",
                DeprecationWarning,
                stacklevel=2,
            )
        return getattr(importlib.import_module(f"ackkit.{where}"), name)
    # The asyncio runtime needs aio-pika, an optional extra: imported on first use.
    if name not in _async.PUBLIC or name == "AsyncPullConnection":
        raise AttributeError(f"module 'ackkit' has no attribute {name!r}")
    value = _async.public(name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


__all__ = [  # noqa: RUF022 - plain sorted() order, see tests/unit/test_public_api.py
    "AckIndex",
    "AckMode",
    "App",
    "AsyncApp",
    "AsyncDelivery",
    "Batch",
    "Consumer",
    "DeadLetterMessage",
    "Delivery",
    "Flow",
    "FlushPolicy",
    "Publication",
    "Queue",
    "RejectMessage",
    "RequeueMessage",
    "Retry",
    "RetryLater",
    "RetryStrategy",
    "TLS",
    "Unsettled",
    "__version__",
    "aconnect",
    "connect",
]
