"""App: decorator-registered listeners on pika, run in the foreground or background."""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Any

from .._app.handler import Binding
from .._app.spec import AppBase
from .._messages.publish import NOT_RUNNING, Outgoing, publishes
from . import flowing
from .consumer import Consumer
from .runtime import Runtime

log = logging.getLogger("ackkit")


class App(AppBase):
    """Listeners on RabbitMQ with acknowledgement that is correct by construction.

    ```
    app = App("amqp://guest:guest@127.0.0.1:5672/%2f")

    @app.listener("orders", ack_mode=AckMode.AUTO, consumer=Consumer(prefetch=100))
    def on_order(order: Order) -> None: ...

    app.run()              # blocks; SIGINT/SIGTERM or app.stop() -> graceful shutdown
    with app.running(): ...  # in a background thread, stopped gracefully on exit
    ```
    """

    _runtime: Runtime | None = None
    _stopped: threading.Event | None = None

    def _check_handler(self, binding: Binding) -> None:
        if binding.is_async:
            raise TypeError(
                f"{binding.name}: a coroutine handler (async def) on the pika App would never "
                "run (calling it only creates a coroutine); make it a plain `def`, or register "
                "it on AsyncApp"
            )

    def start(self) -> None:
        """Connect, declare, start consuming; returns once every listener consumes."""
        with self._starting("App", Runtime) as rt:
            self._stopped = threading.Event()
            rt.start()
        log.info("%d listener(s) consuming from %s", len(self.specs), self.safe_url)

    def stop(self, timeout: float | None = None) -> None:
        """Graceful shutdown: cancel, finish in-flight handlers, requeue the rest, flush acks."""
        rt = self._runtime
        if rt is None:
            return
        rt.stop(timeout)
        self._runtime = None
        if self._stopped is not None:
            self._stopped.set()

    def run(self) -> None:
        """Run until SIGINT/SIGTERM (main thread) or stop() from another thread."""
        self.start()
        restore: list[tuple[signal.Signals, Any]] = []
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                restore.append((sig, signal.signal(sig, self._on_signal)))
        stopped = self._stopped
        assert stopped is not None
        try:
            while not stopped.wait(0.2):
                rt = self._runtime
                if rt is not None and rt.fatal is not None:
                    raise rt.fatal
        finally:
            for sig, old in restore:
                signal.signal(sig, old)
            self.stop()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        log.info("signal %d, shutting down gracefully", signum)
        threading.Thread(target=self.stop, name="ackkit-stop", daemon=True).start()

    @contextlib.contextmanager
    def running(self) -> Iterator[App]:
        """Run in the background for the duration of a with-block."""
        self.start()
        rt = self._runtime
        try:
            yield self
        finally:
            self.stop()
        if rt is not None and rt.fatal is not None:
            raise rt.fatal  # the app stopped itself while the block ran

    @publishes
    def publish(self, msg: Outgoing) -> None:
        """Publish a message and wait until the broker confirmed it, from any thread
        (handlers included) while the app runs."""
        rt = self._runtime
        if rt is None:
            raise RuntimeError(NOT_RUNNING)
        rt.publish(msg)

    def pause(self, listener: str | None = None) -> None:
        """Stop consuming: the listener named (all of them by default) cancels its
        consumer and returns the deliveries it holds unstarted to the queue (not counted
        as attempts); handlers already running finish. Returns at once; the consumer is
        cancelled on the I/O thread right after."""
        for c in self._consumers("pause", listener):
            flowing.set_paused(c, True)

    def resume(self, listener: str | None = None) -> None:
        """Consume again after `pause()` (a tripped circuit breaker stays tripped)."""
        for c in self._consumers("resume", listener):
            flowing.set_paused(c, False)

    def _consumers(self, what: str, listener: str | None) -> list[Consumer]:
        rt = self._runtime
        if rt is None:
            raise RuntimeError(f"App is not running: nothing to {what}")
        self._listener_name(listener)
        return [c for c in rt.consumers if listener is None or c.spec.name == listener]
