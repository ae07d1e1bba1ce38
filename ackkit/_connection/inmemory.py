"""The seam between the runtimes and the test kit's in-memory broker.

A `memory://<name>` URL names an `ackkit.testing.InMemoryBroker` registered here
while it is open. The runtimes ask `broker_for(url)` where they would open a
client library connection (`_sync._pika`, `_async._amqp`) and get the broker's
stand-ins for pika's and aiormq's connections instead: everything above that
(the core, consumers, executors, publishers) runs unchanged.
"""

from __future__ import annotations

import threading
import urllib.parse
import weakref
from typing import Any

SCHEME = "memory"

_lock = threading.Lock()
_brokers: weakref.WeakValueDictionary[str, Any] = weakref.WeakValueDictionary()


def is_memory(url: str) -> bool:
    return url[: len(SCHEME) + 3].lower() == f"{SCHEME}://"


def register(name: str, broker: Any) -> None:
    with _lock:
        if name in _brokers:
            raise ValueError(f"an in-memory broker named {name!r} is open already")
        _brokers[name] = broker


def unregister(name: str) -> None:
    with _lock:
        _brokers.pop(name, None)


def broker_for(url: str) -> Any | None:
    """The open in-memory broker a memory:// URL names; None for any other URL.

    Raises FatalConnectError for a memory:// URL whose broker is not open (closed,
    or never created): retrying cannot make it appear."""
    if not is_memory(url):
        return None
    name = urllib.parse.urlsplit(url).hostname or ""
    with _lock:
        broker = _brokers.get(name)
    if broker is None:
        from .io import FatalConnectError

        raise FatalConnectError(
            f"no in-memory broker named {name!r} is open (create one with "
            "ackkit.testing.InMemoryBroker() and use its .url)"
        )
    return broker
