"""AsyncRuntime: one AsyncApp's connection life on an event loop, from start to stop.

It opens the connection (reconnecting with backoff), declares the queues,
opens one `AsyncConsumer` per listener and the `AsyncPublisher` for copies,
flushes pending acks every `TICK`, and carries out each phase of a graceful stop
(in the order `ackkit._interpreter.stopping` walks them) with awaits. Anything
that must not go on quietly (a failure of ackkit's own tasks, a handler that
raised an interpreter-exit signal) stops the app through `fail()`.

The runtime reads nothing of the app: it gets a `Launch` (`ackkit._app.launch`): the
settings, the listener specs, the observers for their cores and the instrument hooks.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Coroutine, Sequence
from typing import Any
from urllib.parse import parse_qs, urlsplit

import aio_pika
from aiormq.abc import AbstractConnection
from tenacity import AsyncRetrying, retry_if_exception_type

from .._app.declaring import declaration
from .._app.launch import Launch
from .._connection.addresses import Rotation
from .._connection.io import TICK, ConnectFailed, FatalConnectError, reconnect_policy
from .._connection.url import mask_text, mask_url
from .._core.brokers import traits_of
from .._core.consume import check_channels, spare_channels
from .._core.errors import TopologyConflict
from .._core.shutdown import LAST_COPIES
from .._core.stop_budget import StopBudget, may_close
from .._interpreter import stopping
from .._interpreter.stopping import StopStep
from .._messages.publish import EXCHANGE_CHANNELS, Outgoing, channel_for, not_confirmed
from .._telemetry.logs import log_attempt
from .._telemetry.observers import observing
from . import cancels
from ._amqp import CHANNEL_GONE, ChannelNumbers, declare_queues, open_connection
from .consumer import CANCEL_TIMEOUT, AsyncConsumer
from .publisher import AsyncPublisher

log = logging.getLogger("ackkit")


class AsyncRuntime:
    """Runs the listeners of an AsyncApp until stopped; reconnects with backoff."""

    def __init__(self, launch: Launch) -> None:
        settings = launch.settings
        self.settings = settings
        # The node address each connection attempt uses: with several, the next one
        # after a failed attempt or a lost connection (`ackkit._connection.addresses`).
        self.rotation = Rotation(settings.urls)
        self.safe_url = settings.safe_url  # the current attempt's address, once it has one
        # Exchanges, bindings and the queues no listener consumes: the app's `_plan()`.
        self.exchanges = launch.exchanges
        self.loop = asyncio.get_running_loop()
        # `observer` (ackkit's log lines) is called in place; the app's registered
        # `observers` on a thread of their own, off the listeners' locks
        # (`ackkit._telemetry.observers`).
        observer, self.events = observing(launch.observer, launch.observers)
        # The app's messages, a channel per exchange (`channel_for`); the default
        # exchange's also carries a settler's copies.
        self.publisher = AsyncPublisher(self)
        self.publishers: dict[str, AsyncPublisher] = {"": self.publisher}
        self.exchange_channels = 0  # how many of those the connection has room for
        self.consumers = [
            AsyncConsumer(self, s, observer, launch.instruments) for s in launch.specs
        ]
        self.connection: aio_pika.abc.AbstractConnection | None = None
        self.amqp: AbstractConnection | None = None
        self.numbers = ChannelNumbers()
        self.stopping = False
        self.fatal: BaseException | None = None
        self.ready = asyncio.Event()
        self._stop_requested = asyncio.Event()
        self._serving = False
        self._main: asyncio.Task[None] | None = None
        self._ticker: asyncio.Task[None] | None = None
        self._background: set[asyncio.Task[Any]] = set()
        self._stop_task: asyncio.Task[None] | None = None

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task: asyncio.Task[Any] = self.loop.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    def fail(self, exc: BaseException, what: str) -> None:
        """The app stops for `exc` (`stopping.failed`); `run()` raises it."""
        stopping.failed(self, exc, what)
        if self._stop_task is None:
            self._stop_task = self.loop.create_task(self._stop(None))

    async def publish(self, msg: Outgoing) -> None:
        """Publish an app message, confirmed; while reconnecting, wait for the connection
        (within the message's timeout)."""
        deadline = self.loop.time() + msg.timeout
        while not self._serving:
            if self.stopping or self.loop.time() >= deadline:
                raise not_confirmed(msg, "not published: the app is not connected")
            await asyncio.sleep(0.02)
        remaining = max(deadline - self.loop.time(), 0.001)
        key = channel_for(msg.exchange, self.publishers, self.exchange_channels)
        p = self.publishers.get(key)
        if p is None:
            p = self.publishers[key] = AsyncPublisher(self)
        await p.send(dataclasses.replace(msg, timeout=remaining))

    async def pause(self, delay: float) -> bool:
        """Sleep `delay` seconds; True (at once) once a stop holds the cores (its `HOLD`
        phase: a retry does not run again)."""
        cut = self._stop_requested
        if cut.is_set():
            return True
        try:
            await asyncio.wait_for(cut.wait(), delay)
        except TimeoutError:
            return cut.is_set()
        return True

    def stats(self) -> dict[str, dict[str, int]]:
        """Lifecycle counters per listener (received, acked, dead_lettered, ...)."""
        return {c.spec.name: c.core.counters.snapshot() for c in self.consumers}

    # -- lifecycle -----------------------------------------------------------------

    async def start(self) -> None:
        if self.events is not None:
            self.events.start()
        self._main = self.loop.create_task(self._run_forever(), name="ackkit-async-main")
        self._ticker = self.loop.create_task(self._tick_forever(), name="ackkit-async-tick")
        ready = self.loop.create_task(self.ready.wait())
        try:
            await asyncio.wait(
                {ready, self._main},
                timeout=self.settings.startup_timeout,
                return_when=asyncio.FIRST_COMPLETED,
            )
        finally:
            ready.cancel()
        if self.fatal is not None or not self.ready.is_set():
            fatal = self.fatal
            await self.stop(0)
            if fatal is not None:
                raise fatal
            s = self.settings
            raise ConnectFailed(f"no connection to {s.safe_url} within {s.startup_timeout} s")

    async def _run_forever(self) -> None:
        try:
            while not self.stopping:
                retry = retry_if_exception_type(ConnectFailed)
                most = self.settings.reconnect_max_interval
                retrying = AsyncRetrying(**reconnect_policy(most, retry, lambda: self.safe_url))
                async for attempt in retrying:
                    with attempt:
                        if self.stopping:
                            return
                        await self._serve()
        except (FatalConnectError, TopologyConflict) as exc:
            self.fatal = exc  # retrying cannot fix these
        except asyncio.CancelledError:
            if not self.stopping:
                raise
        except BaseException as exc:  # a bug of ours: surfaced to start() / run()
            self.fail(exc, "ackkit async runtime failed")

    async def _serve(self) -> None:
        """One connection's life, to the rotation's current address (the next one after
        it ends). Raises ConnectFailed if it never served."""
        url = self.rotation.current
        self.safe_url = mask_url(url)
        several = len(self.rotation.urls) > 1
        log_attempt(self.safe_url, self.rotation.index, len(self.rotation.urls))
        try:
            await self._serve_one(url)
        finally:
            if several:
                self.rotation.advance()

    async def _serve_one(self, url: str) -> None:
        s = self.settings
        conn, amqp = await open_connection(
            url,
            heartbeat=s.heartbeat,
            name=s.connection_name,
            timeout=10.0,
            tls=s.tls_for(url),
        )
        self.connection, self.amqp, self.numbers = conn, amqp, ChannelNumbers.of(amqp)
        broker = traits_of(amqp.server_properties)
        try:
            try:
                limit = self._channel_max(amqp)
                too_few = check_channels(len(self.consumers), limit, self.safe_url)
                if too_few is not None:
                    raise FatalConnectError(too_few)  # from start(): no retry makes channels
                spare = spare_channels(len(self.consumers), limit)
                self.exchange_channels = min(EXCHANGE_CHANNELS, spare)
                for c in self.consumers:
                    c.core.use_broker(broker)  # before anything of this connection is decided
                    c.core.queues.check_broker()  # TopologyConflict: fatal, from start()
                await self.declare_for(amqp, self.consumers)
                for c in self.consumers:
                    await c.open(amqp, self.numbers)
            except (TimeoutError, *CHANNEL_GONE) as exc:
                raise ConnectFailed(mask_text(repr(exc))) from None
            self._serving = True
            self.ready.set()
            await asyncio.wait({amqp.closing})
        finally:
            self._serving = False
            with contextlib.suppress(Exception):
                await conn.close()
            for c in self.consumers:
                c.lost(None)
            for p in self.publishers.values():
                p.channel = None
            for c in self.consumers:
                c.copies.channel = None
        if not self.stopping:
            reason = "" if amqp.closing.cancelled() else repr(amqp.closing.exception())
            log.warning(
                "connection to %s lost (%s); reconnecting",
                self.safe_url,
                mask_text(reason),
            )

    def _channel_max(self, amqp: AbstractConnection) -> int:
        """The channels this connection may have: the broker's channel_max, or the URL's
        ?channel_max= when lower (aiormq does not send it; ackkit keeps to it)."""
        tune = getattr(amqp, "connection_tune", None)
        limit = getattr(tune, "channel_max", 0) or 65535
        asked = parse_qs(urlsplit(self.settings.url).query).get("channel_max")
        if asked and asked[0].isdigit() and int(asked[0]) > 0:
            limit = min(limit, int(asked[0]))
        return limit

    async def declare_for(
        self, amqp: AbstractConnection, consumers: Sequence[AsyncConsumer]
    ) -> None:
        """Declare (or check) the queues, exchanges and bindings of `consumers`: all of
        them when a connection opens; one whose queue was deleted, later."""
        own, user, existing, exchanges = declaration(
            consumers, self.exchanges, len(self.consumers), log
        )
        await declare_queues(amqp, self.numbers, own, user, existing, exchanges)

    async def _tick_forever(self) -> None:
        while True:
            await asyncio.sleep(TICK)
            for c in self.consumers:
                try:
                    await c.tick()
                except Exception:  # pragma: no cover - keep flushing the other listeners
                    log.exception("%s: flushing acks failed", c.spec.name)

    async def stop(self, timeout: float | None = None) -> None:
        """Graceful, in the order of `ackkit._interpreter.stopping`: consumers cancelled,
        unstarted deliveries returned, handlers finished, acks and copies settled, the
        outbox relay's batch ended, the connection closed.

        Concurrent calls share one shutdown."""
        if self._stop_task is None:
            self._stop_task = self.loop.create_task(self._stop(timeout))
        await asyncio.shield(self._stop_task)

    async def _stop(self, timeout: float | None) -> None:
        timeout = self.settings.shutdown_timeout if timeout is None else timeout
        self.stopping = True
        amqp = self.amqp
        live = self._serving and amqp is not None and not amqp.is_closed
        await stopping.awalk(self, live, StopBudget(timeout), timeout)

    # -- the stop's phases (`stopping.Stopper`) --------------------------------------

    async def hold_starts(self, due: StopStep) -> None:
        """The cores hold: nothing starts, what would have waits for the cancel."""
        for c in self.consumers:
            c.core.shutdown.hold()
        self._stop_requested.set()  # cuts in-process retry and rate-limit waits short

    async def cancel_consumers(self, due: StopStep) -> None:
        """basic.cancel for every consumer at once; each cancel-ok awaited."""
        await asyncio.gather(*(c.cancel(due.wait) for c in self.consumers))
        await asyncio.sleep(0)  # callbacks of deliveries that arrived before CancelOk

    async def return_unstarted(self, due: StopStep) -> None:
        """The cores stop (held acks out, what they kept back as copies); the backlogs,
        partial batches and what the flow gate holds go back too."""
        for c in self.consumers:
            await c.stop()
            await c.release_unstarted()

    async def finish_handlers(self, due: StopStep) -> None:
        """Running handlers get `due.wait`; the late ones are cancelled (released)."""
        await self._finish_handlers(due.wait, due.told)

    async def settle(self, due: StopStep) -> None:
        """Settle rounds until `_settle` says the connection may close."""
        await self._settle(time.monotonic() + due.wait)

    async def end_relay(self, due: StopStep) -> None:
        """Each outbox relay ends its batch (never cancelled mid-way before `due.wait`)."""
        await asyncio.gather(*(c.tx.finish(due.wait) for c in self.consumers if c.tx is not None))

    async def close_connection(self, due: StopStep) -> None:
        """Ackkit's tasks end, the connection closes (close-ok awaited `due.wait`)."""
        for task in (self._ticker, *self._background):
            if task is not None:
                cancels.cancel(task)
        conn = self.connection
        if conn is not None:  # a broker that blocks the connection may never answer close
            with contextlib.suppress(Exception):
                await asyncio.wait_for(conn.close(), due.wait)
        if self._main is not None and not self._main.done():
            cancels.cancel(self._main)
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(self._main, 10.0)

    async def release(self, due: StopStep) -> None:
        """The thread pools and the inbox's connections closed; the observers heard all."""
        for c in self.consumers:
            if c.pool is not None:
                c.pool.shutdown(wait=False, cancel_futures=True)
            if c.tx is not None:
                await c.tx.close()
        if self.events is not None:  # every event emitted so far heard by the observers
            await asyncio.to_thread(self.events.close)

    async def _settle(self, deadline: float) -> None:
        """Settle rounds: deliveries still unstarted back to the core, pending acks out,
        until every core is quiescent (copies confirmed) or the deadline; its last
        `LAST_COPIES` seconds are for the copies in flight alone, and copies still in
        flight at the deadline get `COPY_GRACE` more (`may_close`)."""
        while True:
            last = time.monotonic() >= deadline - LAST_COPIES
            for c in self.consumers:
                await c.release_unstarted()
                if last:  # no copy more: what waits for one goes back as it is
                    await c.give_back()
                await c.drain()
            # A confirmed copy's task still has the original's ack to send: not done yet
            # (closing now would leave the original to be requeued next to its copy). A
            # listener's copies go out on its own publisher, not on the app's.
            publishers = (*self.publishers.values(), *(c.copies for c in self.consumers))
            busy = any(p.pending for p in publishers)
            quiet = all(c.core.shutdown.quiescent for c in self.consumers) and not busy
            in_flight = busy or any(c.core.shutdown.copies_in_flight for c in self.consumers)
            if may_close(quiet, in_flight, time.monotonic(), deadline):
                return
            await asyncio.sleep(0.02)

    async def _finish_handlers(self, timeout: float, told: float | None = None) -> None:
        deadline = time.monotonic() + timeout
        while any(c.running for c in self.consumers) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        late = [t for c in self.consumers for t in c.tasks if not t.done()]
        if not late:
            return
        for c in self.consumers:
            if c.running:
                log.warning(
                    "%s: %d handler(s) still running after %.1f s; cancelled, "
                    "their deliveries are requeued",
                    c.spec.name,
                    c.running,
                    timeout if told is None else told,
                )
        for t in late:
            cancels.cancel(t)
        await asyncio.wait(late, timeout=CANCEL_TIMEOUT)
