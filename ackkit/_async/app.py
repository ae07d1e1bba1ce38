"""AsyncApp: decorator-registered listeners on aio-pika, run on an asyncio event loop."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import signal
import threading
import typing
from collections.abc import AsyncIterator

from .._app.handler import Binding, annotated
from .._app.spec import AppBase
from .._messages.publish import NOT_RUNNING, Outgoing, apublishes
from . import flowing
from .delivery import AsyncDelivery
from .runtime import AsyncRuntime

log = logging.getLogger("ackkit")


class AsyncApp(AppBase):
    """Listeners on RabbitMQ with acknowledgement that is correct by construction, on asyncio.

    ```
    app = AsyncApp("amqp://guest:guest@127.0.0.1:5672/%2f")

    @app.listener("orders", ack_mode=AckMode.AUTO, consumer=Consumer(prefetch=100, concurrency=50))
    async def on_order(order: Order) -> None: ...

    await app.run()                  # until SIGINT/SIGTERM or app.stop()
    async with app.running(): ...    # consume for the duration of the block
    ```

    Same ack modes, retry, dead-lettering and shutdown as the pika `App`; the
    decisions come from the same core. `async def` handlers run on the loop
    and settle with `await delivery.ack()` (an AsyncDelivery). Plain `def`
    handlers run in a thread pool of `Consumer(concurrency=...)` threads per listener;
    their `delivery.ack()` blocks until the loop has carried the settle out.

    With a concurrency > 1 handlers finish out of order. Acks then go out as
    one multiple-ack over the contiguous finished prefix of delivery tags, and
    deliveries that finished behind a still-running one are acked one by one
    when the pending acks are flushed (by count, every `FlushPolicy.interval`,
    and at shutdown): a multiple-ack never covers a delivery whose handler has
    not finished, and one slow handler does not hold back everyone else's acks.
    """

    _protocols = ("amqp0-9-1",)

    _runtime: AsyncRuntime | None = None
    _stop_request: asyncio.Event | None = None

    def _check_inbox_handler(self, binding: Binding) -> None:
        if not binding.is_async:
            raise TypeError(
                f"{binding.name}: an inbox listener on AsyncApp runs its handler in an "
                "AsyncConnection's transaction, so the handler must be `async def`"
            )

    def _check_handler(self, binding: Binding) -> None:
        if binding.is_async:
            return
        try:
            hints = typing.get_type_hints(annotated(binding.fn))
        except Exception:
            return
        params = list(inspect.signature(binding.fn).parameters)
        for p in params[:2]:
            tp = hints.get(p)
            for t in (tp, *typing.get_args(tp)):
                if isinstance(t, type) and issubclass(t, AsyncDelivery):
                    raise TypeError(
                        f"{binding.name}: a plain `def` handler gets a Delivery with a blocking "
                        "ack(); annotate it `Delivery`, or make the handler `async def`"
                    )

    async def start(self) -> None:
        """Connect, declare, start consuming; returns once every listener consumes."""
        with self._starting("AsyncApp", AsyncRuntime) as rt:
            self._stop_request = asyncio.Event()
            await rt.start()
        log.info("%d async listener(s) consuming from %s", len(self.specs), self.safe_url)

    async def stop(self, timeout: float | None = None) -> None:
        """Graceful shutdown: cancel, finish in-flight handlers, requeue the rest, flush acks."""
        rt = self._runtime
        if rt is None:
            return
        if self._stop_request is not None:
            self._stop_request.set()
        try:
            await rt.stop(timeout)
        finally:
            self._runtime = None

    def request_stop(self) -> None:
        """Ask `run()` to shut down gracefully (safe from signal handlers and callbacks)."""
        if self._stop_request is not None:
            self._stop_request.set()

    async def run(self) -> None:
        """Run until SIGINT/SIGTERM (main thread), `request_stop()` or `stop()`."""
        await self.start()
        loop = asyncio.get_running_loop()
        installed: list[signal.Signals] = []
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                with contextlib.suppress(NotImplementedError, RuntimeError):
                    loop.add_signal_handler(sig, self._on_signal, sig)
                    installed.append(sig)
        stop = self._stop_request
        assert stop is not None
        try:
            while not stop.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 0.2)
                rt = self._runtime
                if rt is None:
                    return
                if rt.fatal is not None:
                    raise rt.fatal
        finally:
            for sig in installed:
                loop.remove_signal_handler(sig)
            await self.stop()

    def _on_signal(self, sig: signal.Signals) -> None:
        log.info("signal %d, shutting down gracefully", sig)
        self.request_stop()

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[AsyncApp]:
        """Consume for the duration of an `async with` block, then shut down gracefully."""
        await self.start()
        rt = self._runtime
        try:
            yield self
        finally:
            await self.stop()
        if rt is not None and rt.fatal is not None:
            raise rt.fatal  # the app stopped itself while the block ran

    @apublishes
    async def publish(self, msg: Outgoing) -> None:
        """Publish a message and wait until the broker confirmed it, while the app runs
        (handlers included)."""
        rt = self._runtime
        if rt is None:
            raise RuntimeError(NOT_RUNNING.replace("app.run()", "await app.run()"))
        await rt.publish(msg)

    def pause(self, listener: str | None = None) -> None:
        """Stop consuming: the listener named (all of them by default) cancels its
        consumer and returns the deliveries it holds unstarted to the queue (not counted
        as attempts); handlers already running finish. Returns at once (callable from
        any thread); the event loop carries it out right after."""
        self._flow("pause", listener, True)

    def resume(self, listener: str | None = None) -> None:
        """Consume again after `pause()` (a tripped circuit breaker stays tripped)."""
        self._flow("resume", listener, False)

    def _flow(self, what: str, listener: str | None, paused: bool) -> None:
        rt = self._runtime
        if rt is None:
            raise RuntimeError(f"AsyncApp is not running: nothing to {what}")
        self._listener_name(listener)
        for c in rt.consumers:
            if listener is None or c.spec.name == listener:
                rt.loop.call_soon_threadsafe(
                    lambda c=c: rt.spawn(flowing.set_paused(c, paused))  # type: ignore[misc]
                )
