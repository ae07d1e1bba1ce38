"""`Host`: what a sync `Consumer` needs of the runtime that runs it (moved out of
`consumer.py`, which re-exports it). Generic in the consumer the runtime is handed
back (`consumer_ready`, `redeclare`), so this module need not import `consumer.py`.
`OnChannel`: what each of the consumer's helper modules (`flowing`, `refusals`) reads
of the consumer itself, at the least."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

if TYPE_CHECKING:
    from .._core.listener import ListenerCore
    from .._messages.publish import Outgoing

C = TypeVar("C", contravariant=True)


class Host(Protocol[C]):
    """What a consumer (`C`) needs of the runtime that runs it (`Runtime`)."""

    connection: Any
    stopping: bool
    stop_event: threading.Event

    def channels_lost(self, reason: BaseException, /) -> None: ...

    def call_soon(self, fn: Callable[[], None], /) -> object: ...

    def consumer_ready(self, c: C, /) -> None: ...

    def redeclare(self, c: C, /) -> None: ...

    def fail(self, exc: BaseException, what: str, /) -> None: ...

    def publish(self, msg: Outgoing, /) -> None: ...


class OnChannel(Protocol):
    """What the sync `Consumer`'s helper modules read of it, every one: its consumer
    tag, its core, its channel and the lock that guards them (each module's protocol
    adds what else it uses)."""

    consumer_tag: str | None

    @property
    def core(self) -> ListenerCore: ...
    @property
    def channel(self) -> Any: ...
    @property
    def lock(self) -> threading.Lock: ...
