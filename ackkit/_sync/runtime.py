"""The App's runtime: its listeners' consumers and publisher on one pika connection.

The connection's life (connect, reconnect with backoff, the I/O thread) is the
`Engine`'s; this module starts the consumers, carries out each phase of a stop
(in the order `ackkit._interpreter.stopping` walks them) with threads, events
and the I/O thread, and turns a failure of ackkit's own threads into a stopped
app (`fail`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

from .._app.declaring import declaration
from .._app.launch import Launch
from .._app.settings import AMQP10
from .._connection.io import ConnectFailed, FatalConnectError
from .._core.brokers import amqp10_traits, traits_of
from .._core.consume import check_channels, spare_channels
from .._core.errors import TopologyConflict
from .._core.settlement import unsupported
from .._core.shutdown import LAST_COPIES
from .._core.stop_budget import COPY_GRACE, StopBudget, may_close
from .._interpreter import stopping
from .._interpreter.stopping import StopStep
from .._messages.publish import EXCHANGE_CHANNELS, Outgoing, channel_for, not_confirmed
from .._telemetry.observers import observing
from . import flowing
from ._pika import blocking_connection, declare_queues, drop, parameters
from .consumer import Consumer
from .engine import Engine
from .publisher import Publisher, Ticket

log = logging.getLogger("ackkit")


class Runtime(Engine):
    """Runs the listeners of an App until stopped; reconnects with backoff."""

    def __init__(self, launch: Launch) -> None:
        settings = launch.settings
        super().__init__(
            settings.url, settings.safe_url, settings.reconnect_max_interval, settings.urls
        )
        self.settings = settings
        self.settings_specs = launch.specs
        # Exchanges, bindings and the queues no listener consumes: the app's `_plan()`.
        self.exchanges = launch.exchanges
        # `observer` (ackkit's log lines) is called in place; the app's registered
        # `observers` on a thread of their own, off the listeners' locks
        # (`ackkit._telemetry.observers`).
        observer, self.events = observing(launch.observer, launch.observers)
        self.consumers = [Consumer(self, s, observer, launch.instruments) for s in launch.specs]
        # The app's own messages, a channel per exchange (`channel_for`); each listener
        # has its copies' channel.
        self.publisher = Publisher(self)
        self.publishers: dict[str, Publisher] = {"": self.publisher}
        self.exchange_channels = 0  # how many of those the connection has room for
        self.stop_event = threading.Event()
        self.ready = threading.Event()
        self._ready: set[str] = set()  # listeners that consume (or stand by) on this connection
        self._done = threading.Event()
        self._stop_lock = threading.Lock()

    # -- lifecycle (caller's thread) -------------------------------------------

    def start(self) -> None:
        if self.settings.protocol == AMQP10:
            for spec in self.settings_specs:
                why = unsupported(
                    spec.name, spec.policy.mode, spec.exclusive, spec.consumer_arguments
                )
                if why is not None:
                    raise ValueError(why)
        if self.events is not None:
            self.events.start()
        for c in self.consumers:
            c.start_workers()
        self.start_io("ackkit-io")
        s = self.settings
        deadline = time.monotonic() + s.startup_timeout
        while not self.ready.wait(0.05):
            if self.fatal is not None:
                self._join_workers(0)
                if self.events is not None:
                    self.events.close()
                raise self.fatal
            if time.monotonic() > deadline:
                self.stop()
                raise ConnectFailed(f"no connection to {s.safe_url} within {s.startup_timeout} s")

    def publish(self, msg: Outgoing) -> None:
        """Publish an app message on the publisher channel and wait for the broker's
        confirm (any thread but the I/O thread); a PublishError when it did not come."""
        if threading.current_thread() is self._thread:
            raise RuntimeError("publish() on ackkit's I/O thread would wait for itself")
        t = Ticket(msg)
        deadline = time.monotonic() + msg.timeout
        while not self.call_soon(lambda: self._publisher(msg.exchange).send(t)):
            if self._done.is_set() or time.monotonic() >= deadline:
                raise not_confirmed(msg, "not published: the app is not connected")
            time.sleep(0.02)
        if not t.wait(max(0.0, deadline - time.monotonic())):
            why = f"no confirm within {msg.timeout} s"
            if t.withdraw():
                why = f"not published: no connection within {msg.timeout} s"
            raise not_confirmed(msg, why)
        if t.error is not None:
            raise t.error

    def _publisher(self, exchange: str) -> Publisher:
        """The publishing channel for app messages to `exchange` (I/O thread)."""
        key = channel_for(exchange, self.publishers, self.exchange_channels)
        p = self.publishers.get(key)
        if p is None:
            p = self.publishers[key] = Publisher(self)
            conn = self.connection
            if conn is not None and conn.is_open:
                p.open(conn)
        return p

    def fail(self, exc: BaseException, what: str) -> None:
        """The app stops for `exc` (`stopping.failed`); `run()` raises it."""
        stopping.failed(self, exc, what)
        if not self.stopping:
            threading.Thread(target=self.stop, name="ackkit-stop", daemon=True).start()

    def stop(self, timeout: float | None = None) -> None:
        """Graceful, in the order of `ackkit._interpreter.stopping`: consumers cancelled,
        unstarted deliveries returned, handlers finished, acks and copies settled, the
        outbox relay's batch ended, the connection closed."""
        with self._stop_lock:  # one shutdown, whoever asks (app.stop(), fail())
            if self.stopping and self._done.is_set():
                return
            timeout = self.settings.shutdown_timeout if timeout is None else timeout
            self.request_stop()
            conn = self.connection
            live = conn is not None and conn.is_open
            stopping.walk(self, live, StopBudget(timeout), timeout)

    # -- the stop's phases (caller's thread; `stopping.Stopper`) ----------------------

    def hold_starts(self, due: StopStep) -> None:
        """The cores hold: nothing starts, what would have waits for the cancel."""
        for c in self.consumers:
            with c.lock:
                c.core.shutdown.hold()
        self.stop_event.set()  # cuts in-process retry and rate-limit waits short

    def cancel_consumers(self, due: StopStep) -> None:
        """basic.cancel on the I/O thread; its cancel-ok (or the channel's end) awaited."""
        if not self.call_soon(self._cancel_all):
            return
        deadline = time.monotonic() + due.wait
        for c in self.consumers:
            c.cancelled.wait(max(0.0, deadline - time.monotonic()))

    def return_unstarted(self, due: StopStep) -> None:
        """The cores stop (held acks out, what they kept back as copies); what no worker
        took yet and what the flow gate holds go back too."""
        for c in self.consumers:
            with c.lock:
                acts = c.core.shutdown.stop()
                if acts:
                    c.send(acts)
            self._return_left(c)

    def finish_handlers(self, due: StopStep) -> None:
        """Workers end once their handler returns; one past `due.wait` is the broker's."""
        self._join_workers(due.wait, due.told)

    def settle(self, due: StopStep) -> None:
        """Settle rounds on the I/O thread until `_settle` says the connection may close."""
        settled = threading.Event()
        deadline = time.monotonic() + due.wait
        if self.call_soon(lambda: self._settle(settled, deadline)):
            settled.wait(due.wait + COPY_GRACE + 1.0)

    def end_relay(self, due: StopStep) -> None:
        """The inbox's relay ends its batch, then its threads and connections close (its
        own joins: `SyncInbox.close`)."""
        for c in self.consumers:
            if c.tx is not None:
                c.tx.close()

    def close_connection(self, due: StopStep) -> None:
        """The connection closes (dropped if no close-ok within `due.wait`); the I/O
        thread ends."""
        conn = self.connection

        def close() -> None:
            if conn is not None and conn.is_open:
                conn.close()
                # a broker that blocks the connection (an alarm) may never answer close-ok
                conn.ioloop.call_later(due.wait, lambda: drop(conn))

        self.call_soon(close)
        self._done.set()
        if self._thread is not None:
            self._thread.join(due.wait + 1.0)

    def release(self, due: StopStep) -> None:
        """Every event emitted so far heard by the observers."""
        if self.events is not None:
            self.events.close()

    def _return_left(self, c: Consumer) -> None:
        """Any thread: `c`'s deliveries no worker took and those the flow gate and the
        core hold go back to the (stopping) core, which returns each."""
        left = c.inbox.drain()
        left.extend(flowing.waiting(c))  # held by the flow gate (a busy key, probing)
        if left:
            with c.lock:  # the stopping core releases each
                step = c.core.begin([d._tracked for d in left])
                if step:
                    c.send(step)

    def _join_workers(self, timeout: float, told: float | None = None) -> None:
        for c in self.consumers:
            c.inbox.close(len(c.workers))
        deadline = time.monotonic() + timeout
        for c in self.consumers:
            for th in c.workers:
                th.join(max(0.0, deadline - time.monotonic()))
            # Idle workers are only on their way out (they took their None): a warning is
            # for a handler that runs, never for a start that failed before any delivery.
            alive = sum(th.is_alive() for th in c.workers)
            if alive and c.in_handler:
                log.warning(
                    "%s: %d handler(s) still running after %.0f s; their deliveries are "
                    "requeued by the broker when the channel closes",
                    c.spec.name,
                    min(alive, c.in_handler),
                    timeout if told is None else told,
                )

    # -- I/O thread: the engine's hooks ---------------------------------------------

    def parameters(self) -> Any:
        s = self.settings
        return parameters(
            self.url,
            heartbeat=s.heartbeat,
            name=s.connection_name,
            tls=s.tls_for(self.url),
            amqp10=s.protocol == AMQP10,
        )

    def declare(self, conn: Any) -> None:
        negotiated = getattr(getattr(conn._impl, "params", None), "channel_max", 0) or 0
        too_few = check_channels(len(self.consumers), negotiated, self.settings.safe_url)
        if too_few is not None:
            raise FatalConnectError(too_few)  # from start(): no retry makes channels
        spare = spare_channels(len(self.consumers), negotiated)
        self.exchange_channels = min(EXCHANGE_CHANNELS, spare)
        broker = traits_of(conn._impl.server_properties)
        if self.settings.protocol == AMQP10:
            try:
                broker = amqp10_traits(broker, self.safe_url)
            except ValueError as exc:
                raise FatalConnectError(str(exc)) from None  # from start(): no retry fixes it
        for c in self.consumers:
            with c.lock:
                c.core.use_broker(broker)  # before anything of this connection is decided
            c.core.queues.check_broker()  # TopologyConflict: fatal, from start()
        self._declare_for(conn, self.consumers)

    def _declare_for(self, conn: Any, consumers: Sequence[Consumer]) -> None:
        own, user, existing, exchanges = declaration(
            consumers, self.exchanges, len(self.consumers), log
        )
        # TopologyConflict: fatal, from start()
        declare_queues(conn, own, user, existing, exchanges)

    def redeclare(self, c: Consumer) -> None:
        """I/O thread: listener `c`'s queue was deleted and the core asks for it again:
        its queue, dead-letter and delay queues and bindings are declared on a short
        blocking connection (a thread of its own: the I/O loop goes on), then `c`
        consumes on a new channel. A refused declare stops the app."""
        conn = self.connection

        def work() -> None:
            try:
                blocking = blocking_connection(self.parameters())
                try:
                    self._declare_for(blocking, [c])
                finally:
                    if blocking.is_open:
                        blocking.close()
            except TopologyConflict as exc:
                self.fail(exc, f"{c.spec.name}: declaring its deleted queue again failed")
                return
            except Exception as exc:  # the next consume is refused again: the core counts
                log.warning(
                    "%s: declaring queue %r again failed: %s", c.spec.name, c.spec.queue, exc
                )
            self.call_soon(lambda: c._reopen(conn))

        threading.Thread(target=work, name=f"ackkit-declare-{c.spec.name}", daemon=True).start()

    def opened(self, conn: Any) -> None:
        self._ready.clear()
        for p in self.publishers.values():
            p.open(conn)
        for c in self.consumers:
            c.copies.open(conn)
            c.open(conn)

    def consumer_ready(self, c: Consumer) -> None:
        """`c` consumes (the broker answered its basic.consume), stands by, or is paused."""
        self._ready.add(c.spec.name)
        if len(self._ready) >= len(self.consumers):
            self.ready.set()

    def channels_lost(self, reason: BaseException) -> None:
        """Every consumer channel is gone (the connection closed)."""
        for c in self.consumers:
            if c.channel is not None:
                c._on_channel_closed(c.channel, reason)

    def closed(self, reason: BaseException) -> None:
        self.channels_lost(reason)
        for p in (*self.publishers.values(), *(c.copies for c in self.consumers)):
            if p.channel is not None:
                p._on_closed(p.channel, reason)

    def tick(self) -> None:
        for c in self.consumers:
            c.tick()

    def crashed(self, exc: BaseException) -> None:
        self.fail(exc, "ackkit I/O thread failed")  # a bug of ours: surfaced to start() / run()

    def finished(self) -> None:
        self._done.set()

    def _cancel_all(self) -> None:
        for c in self.consumers:
            ch = c.channel
            if ch is not None and ch.is_open and c.consumer_tag:
                ch.basic_cancel(c.consumer_tag, callback=lambda _f, c=c: c.cancelled.set())
            else:
                c.cancelled.set()

    def _settle(self, settled: threading.Event, deadline: float) -> None:
        """I/O thread, a settle round (`stopping.Phase.SETTLE`): deliveries still unstarted
        (a late delivery, what a stopped worker left) go back to the core, pending acks
        out, until every core is quiescent (copies confirmed) or the deadline (its last
        `LAST_COPIES` seconds for the copies in flight alone, and `COPY_GRACE` more for
        those still in flight then: `may_close`)."""
        last = time.monotonic() >= deadline - LAST_COPIES
        for c in self.consumers:
            self._return_left(c)
            if last:
                c.decide(c.core.shutdown.give_back)  # no copy more: what waits for one goes back
            c.decide(c.core.drain)
        conn = self.connection
        quiet = all(c.core.shutdown.quiescent for c in self.consumers)
        in_flight = any(c.core.shutdown.copies_in_flight for c in self.consumers)
        if not may_close(quiet, in_flight, time.monotonic(), deadline) and conn.is_open:
            conn.ioloop.call_later(0.02, lambda: self._settle(settled, deadline))
            return
        settled.set()
