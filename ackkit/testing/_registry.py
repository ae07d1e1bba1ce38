"""Every broker the kit started and has not closed yet, closed at the latest
when the process exits (a run that never leaves the handle's ``with``)."""

from __future__ import annotations

import atexit
import contextlib
import threading

from ._handle import BrokerHandle

_live: list[BrokerHandle] = []
_live_lock = threading.Lock()
_atexit_installed = False


def _register(handle: BrokerHandle) -> None:
    """Keep `handle` to be closed when the process exits, unless it is unregistered first."""
    global _atexit_installed
    with _live_lock:
        _live.append(handle)
        if not _atexit_installed:
            atexit.register(_close_all)
            _atexit_installed = True


def _unregister(handle: BrokerHandle) -> None:
    """Forget `handle` (it was closed by its owner); a handle never registered is ignored."""
    with _live_lock, contextlib.suppress(ValueError):
        _live.remove(handle)


def _close_all() -> None:
    with _live_lock:
        handles = list(_live)
    for handle in reversed(handles):
        with contextlib.suppress(Exception):
            handle.close()
