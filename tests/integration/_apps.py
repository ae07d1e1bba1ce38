"""Helpers for tests that run an App or an AsyncApp the same way, and a cuttable proxy."""

from __future__ import annotations

import asyncio
import sys
import threading
import urllib.parse
from typing import Any

from _retry_support import REPO

from ackkit import App, AsyncApp

if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
from tests.chaos.proxy import Proxy

__all__ = ["Proxy", "Runner", "proxied"]


def proxied(url: str) -> tuple[Proxy, str]:
    """A cuttable TCP proxy in front of the broker of `url`, and the URL through it."""
    parts = urllib.parse.urlsplit(url)
    proxy = Proxy(parts.port or 5672, parts.hostname or "127.0.0.1")
    netloc = f"{parts.username}:{parts.password}@127.0.0.1:{proxy.port}"
    return proxy, urllib.parse.urlunsplit(parts._replace(netloc=netloc))


class Runner:
    """Start and stop an App, or an AsyncApp on an event loop in a thread, the same way."""

    def __init__(self, app: App | AsyncApp) -> None:
        self.app = app
        self.loop: asyncio.AbstractEventLoop | None = None
        self.thread: threading.Thread | None = None

    def start(self) -> None:
        if isinstance(self.app, App):
            self.app.start()
            return
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        try:
            asyncio.run_coroutine_threadsafe(self.app.start(), self.loop).result(120)
        except BaseException:
            self._close_loop()
            raise

    def alive(self) -> bool:
        rt: Any = self.app._runtime
        if rt is None or rt.fatal is not None:
            return False
        if isinstance(self.app, App):
            return rt._thread is not None and bool(rt._thread.is_alive())
        return rt._main is not None and not rt._main.done()

    def stop(self) -> None:
        if isinstance(self.app, App):
            self.app.stop()
            return
        assert self.loop is not None
        asyncio.run_coroutine_threadsafe(self.app.stop(), self.loop).result(60)
        self._close_loop()

    def _close_loop(self) -> None:
        assert self.loop is not None and self.thread is not None
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()
