"""What an inbox runner needs of the listener it serves, and nothing more: each runtime's
consumer hands its inbox such a host (a small adapter next to it), so the inbox never
imports a runtime."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from .._core.listener import ListenerCore
    from .._core.step import Step
    from .._messages.publish import Outgoing

Decision = Callable[["ListenerCore"], "Step | None"]
"""Asks the listener's core (and may note what it answered); its Step is carried out."""


class SyncHost(Protocol):
    """The App's listener, to its inbox (`SyncInbox`), from any thread."""

    @property
    def name(self) -> str:
        """The listener's name (logs, the inbox's key space)."""
        ...

    def decide(self, fn: Decision, /) -> None:
        """Call `fn` with the core under the listener's lock; what it decides goes to the
        channel in decision order (sent by the I/O thread)."""
        ...

    def wait(self, seconds: float, /) -> bool:
        """Sleep `seconds`; True, at once, when the app is stopping."""
        ...

    def publish(self, msg: Outgoing, /) -> None:
        """Publish `msg` and wait for the broker's confirm (the outbox relay)."""
        ...


class AsyncHost(Protocol):
    """The AsyncApp's listener, to its inbox (`AsyncInbox`), on the event loop."""

    @property
    def name(self) -> str:
        """The listener's name (logs, the inbox's key space)."""
        ...

    @property
    def stopping(self) -> bool:
        """The app is stopping: background work ends."""
        ...

    async def decide(self, fn: Decision, /) -> None:
        """Call `fn` with the core; what it decides goes to the channel at once, in
        decision order."""
        ...

    async def wait(self, seconds: float, /) -> bool:
        """Sleep `seconds`; True, at once, when the app is stopping."""
        ...

    def spawn(self, coro: Coroutine[Any, Any, Any], /) -> asyncio.Task[Any]:
        """Run `coro` as a task of the app (cancelled when it stops)."""
        ...

    async def publish(self, msg: Outgoing, /) -> None:
        """Publish `msg` and wait for the broker's confirm (the outbox relay)."""
        ...
