"""Pull mode: fetch messages one at a time (basic.get) instead of consuming them.

`connect(url)` gives a `PullConnection`, `await aconnect(url)` an `AsyncPullConnection`
(asyncio, needs the `async` extra); both are at the package root as well."""

from typing import TYPE_CHECKING, Any

from . import _async
from ._sync.pull import PullConnection, connect

if TYPE_CHECKING:
    from ._async.pull import AsyncPullConnection, aconnect


def __getattr__(name: str) -> Any:
    if name in ("AsyncPullConnection", "aconnect"):
        return _async.public(name)
    raise AttributeError(f"module 'ackkit.pull' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)


__all__ = ["AsyncPullConnection", "PullConnection", "aconnect", "connect"]
