"""Every publish front of ackkit, opened on one broker (in-memory or real), callable alike.

`Fronts(url)` runs an App and an AsyncApp (on a loop thread of its own), opens a
PullConnection and an AsyncPullConnection, fetches a Delivery and an
AsyncDelivery from them, and keeps the test kit's broker handle: `publish(front,
*args, **kw)` makes the same call on any of them. Shared by the in-memory table
test (tests/unit/test_publish_fronts.py) and the real-broker one
(tests/integration/test_publish_fronts.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import uuid
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

import ackkit
from ackkit import App, AsyncApp, AsyncDelivery, Delivery
from ackkit.testing import BrokerHandle

FRONTS = (
    "App.publish",
    "AsyncApp.publish",
    "Delivery.publish",
    "AsyncDelivery.publish",
    "PullConnection.publish",
    "AsyncPullConnection.publish",
    "broker.publish",
)


class Fronts:
    """All the publish fronts, open on the broker behind `handle`."""

    def __init__(self, handle: BrokerHandle, stack: contextlib.ExitStack) -> None:
        self.handle = handle
        url = handle.url
        suffix = uuid.uuid4().hex[:8]
        self.source = f"fronts.source.{suffix}"  # where the two deliveries come from
        idle = f"fronts.idle.{suffix}"
        self.reply_to = f"fronts.replies.{suffix}"

        self.loop = asyncio.new_event_loop()
        thread = threading.Thread(target=self.loop.run_forever, name="fronts-loop", daemon=True)
        thread.start()
        stack.callback(thread.join, 10)
        stack.callback(self.loop.call_soon_threadsafe, self.loop.stop)

        self.pull = stack.enter_context(ackkit.connect(url))
        self.pull.declare_queue(self.source)
        self.pull.declare_queue(idle)
        self.pull.declare_queue(self.reply_to)
        self.pull.publish(self.source, b"1", reply_to=self.reply_to, correlation_id="c-1")
        self.pull.publish(self.source, b"2", reply_to=self.reply_to, correlation_id="c-1")
        d = self.pull.get(self.source, dead_letter=None)
        assert d is not None
        self.delivery: Delivery = d

        self.app = App(url, shutdown_timeout=2)
        self.app.listener(idle)(lambda d: None)
        stack.enter_context(self.app.running())

        self.aapp = AsyncApp(url, shutdown_timeout=2)

        async def nothing(d: AsyncDelivery) -> None:
            return None

        self.aapp.listener(idle)(nothing)
        stack.enter_context(self._async_context(self.aapp.running()))
        self.apull = stack.enter_context(self._async_context(ackkit.aconnect(url)))
        ad = self.run(self.apull.get(self.source, dead_letter=None))
        assert isinstance(ad, AsyncDelivery)
        self.adelivery: AsyncDelivery = ad
        self._calls: dict[str, Callable[..., Any]] = {
            "App.publish": self.app.publish,
            "AsyncApp.publish": self._sync(self.aapp.publish),
            "Delivery.publish": self.delivery.publish,
            "AsyncDelivery.publish": self._sync(self.adelivery.publish),
            "PullConnection.publish": self.pull.publish,
            "AsyncPullConnection.publish": self._sync(self.apull.publish),
            "broker.publish": handle.publish,
        }
        self.replies: dict[str, Callable[..., Any]] = {
            "Delivery.reply": self.delivery.reply,
            "AsyncDelivery.reply": self._sync(self.adelivery.reply),
        }

    def run(self, coro: Coroutine[Any, Any, Any], timeout: float = 60.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def _sync(self, fn: Callable[..., Coroutine[Any, Any, Any]]) -> Callable[..., Any]:
        return lambda *args, **kw: self.run(fn(*args, **kw))

    @contextlib.contextmanager
    def _async_context(self, cm: Any) -> Iterator[Any]:
        value = self.run(cm.__aenter__())
        try:
            yield value
        finally:
            self.run(cm.__aexit__(None, None, None))

    def publish(self, front: str, *args: Any, **kw: Any) -> None:
        """The same call on one front."""
        self._calls[front](*args, **kw)


@contextlib.contextmanager
def fronts(handle: BrokerHandle) -> Iterator[Fronts]:
    with contextlib.ExitStack() as stack:
        yield Fronts(handle, stack)
