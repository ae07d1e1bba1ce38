"""The I/O loop of an AMQP 1.0 connection: a proton `Container` run on the runtime's
I/O thread, with the calls the runtime makes of pika's `IOLoop`.

proton's container is not thread-safe: `add_callback_threadsafe` is the one call other
threads make. Their callbacks wait in a deque; one `EventInjector` event (a byte on a
pipe the container polls) wakes the loop for all of those queued until it runs them.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from proton import Handler
from proton.reactor import ApplicationEvent, Container, EventInjector

Callback = Callable[[], Any]


class _Timer(Handler):
    """A container task's handler: runs `fn` unless cancelled."""

    __slots__ = ("cancelled", "fn")

    def __init__(self, fn: Callback) -> None:
        super().__init__()
        self.fn = fn
        self.cancelled = False

    def on_timer_task(self, _event: Any) -> None:
        if not self.cancelled:
            self.fn()


class _Wake(ApplicationEvent):
    """The injected event: proton hands it to the handler its context names (itself)."""

    def __init__(self, handler: Any) -> None:
        super().__init__("ackkit_calls")
        self._handler = handler

    @property
    def handler(self) -> Any:
        return self._handler


class Loop:
    """pika's IOLoop calls, on a proton container (see the module's docstring)."""

    def __init__(self, container: Container) -> None:
        self.container = container
        self._injector = EventInjector()
        container.selectable(self._injector)
        self._calls: deque[Callback] = deque()
        self._lock = threading.Lock()
        self._woken = False
        self.closed = False
        self._event: _Wake | None = None

    def bind(self, handler: Any) -> None:
        """Wake-ups go to `handler` (its `on_ackkit_calls` runs `run_calls`)."""
        self._event = _Wake(handler)

    def add_callback_threadsafe(self, fn: Callback) -> None:
        if self.closed:
            raise RuntimeError("the I/O loop is closed")
        with self._lock:
            self._calls.append(fn)
            if self._woken:
                return
            self._woken = True
        assert self._event is not None
        self._injector.trigger(self._event)

    add_callback = add_callback_threadsafe

    def run_calls(self) -> None:
        """I/O thread: the callbacks queued until now, in order."""
        with self._lock:
            self._woken = False
            calls, self._calls = self._calls, deque()
        for fn in calls:
            fn()

    def call_later(self, delay: float, fn: Callback) -> _Timer:
        t = _Timer(fn)
        self.container.schedule(max(0.0, delay), t)
        return t

    def remove_timeout(self, handle: _Timer) -> None:
        handle.cancelled = True

    def start(self) -> None:
        self.container.run()

    def stop(self) -> None:
        """End `start()`: the container closes what is left open and returns."""
        self.closed = True
        self._injector.close()
        self.container.stop()

    def close(self) -> None:
        self.closed = True
