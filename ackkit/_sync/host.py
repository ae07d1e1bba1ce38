"""`Host`: what a sync `Consumer` needs of the runtime that runs it (moved out of
`consumer.py`, which re-exports it)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from .._messages.publish import Outgoing
    from .consumer import Consumer


class Host(Protocol):
    """What a consumer needs of the runtime that runs it (`Runtime`)."""

    connection: Any
    stopping: bool
    stop_event: threading.Event

    def channels_lost(self, reason: BaseException, /) -> None: ...

    def call_soon(self, fn: Callable[[], None], /) -> object: ...

    def consumer_ready(self, c: Consumer, /) -> None: ...

    def redeclare(self, c: Consumer, /) -> None: ...

    def fail(self, exc: BaseException, what: str, /) -> None: ...

    def publish(self, msg: Outgoing, /) -> None: ...
