"""`ConsumerHost`: what an `AsyncConsumer` needs of the runtime that owns it (moved out
of `consumer.py`, which re-exports it)."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from aiormq.abc import AbstractConnection

from ._amqp import ChannelNumbers
from .settling import SettlerHost

if TYPE_CHECKING:
    from .._messages.publish import Outgoing
    from .consumer import AsyncConsumer


class ConsumerHost(SettlerHost, Protocol):
    """What an AsyncConsumer needs from the runtime that owns it."""

    @property
    def stopping(self) -> bool: ...
    @property
    def amqp(self) -> AbstractConnection | None: ...
    @property
    def numbers(self) -> ChannelNumbers: ...

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]: ...
    def fail(self, exc: BaseException, what: str) -> None: ...
    async def pause(self, delay: float) -> bool: ...
    async def publish(self, msg: Outgoing) -> None: ...
    async def declare_for(
        self, conn: AbstractConnection, consumers: Sequence[AsyncConsumer]
    ) -> None: ...
