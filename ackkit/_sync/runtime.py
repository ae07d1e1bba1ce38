"""The pika runtime: an I/O thread owning a SelectConnection, handler worker threads.

pika is not thread-safe, so every channel call happens on the I/O thread.
Workers run handlers and report outcomes to the listener's core under its
lock; whatever actions come back are handed to the I/O thread with
add_callback_threadsafe, tagged with the channel generation they belong to.
The I/O thread drops actions of a generation that is no longer current, so a
delivery tag never reaches a channel it did not come from.
"""

from __future__ import annotations

import dataclasses
import logging
import queue as _queue
import ssl
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import pika
import pika.exceptions
from pika.spec import Basic
from tenacity import Retrying, retry_if_exception_type

from .._core.actions import Ack, Action, Nack, Reject, Republish, TxCommit, TxSelect
from .._core.errors import TopologyConflict
from .._core.events import Observer
from .._core.listener import ListenerCore, Tracked
from .._core.outcome import EXIT_SIGNALS, Outcome
from .._core.policy import AckMode
from .._delivery import Delivery
from .._invocation import Invocation
from .._io import TICK, ConnectFailed, FatalConnectError, reconnect_logger, reconnect_wait
from .._logs import FailureLog, short
from .._spec import ListenerSpec
from .._tls import handshake_hint, tls_failure
from .._url import mask_text
from .._wire import describe
from . import _frames as frames
from ._pika import (
    FaithfulConnection,
    blocking_connection,
    copy_options,
    copy_properties,
    declare_queues,
    parameters,
)

log = logging.getLogger("ackkit")


class Consumer:
    """One listener on one channel (re-opened as a new generation after a loss)."""

    def __init__(self, rt: Runtime, spec: ListenerSpec, observer: Observer | None) -> None:
        self.rt = rt
        self.spec = spec
        self.core = ListenerCore(spec.policy, observer=observer)
        self.lock = threading.Lock()
        self.inbox: _queue.SimpleQueue[Delivery | None] = _queue.SimpleQueue()
        self.channel: Any = None
        self.consumer_tag: str | None = None
        self.workers: list[threading.Thread] = []
        self.in_handler = 0
        self.cancelled = threading.Event()
        self.binding = spec.binding
        self.no_ack = spec.policy.mode is AckMode.NONE
        self.failures = FailureLog(log)
        # Decided actions wait here for the I/O thread, in decision order (see send()).
        self.outbox: deque[tuple[int, list[Action]]] = deque()
        self._flushing = False
        self.probe = rt.app._instrument(spec, self.core)  # metrics, tracing: None when off

    # -- I/O thread ----------------------------------------------------------

    def open(self, conn: Any) -> None:
        conn.channel(on_open_callback=self._on_channel_open)

    def _reopen(self, conn: Any) -> None:
        if conn.is_open and not self.rt.stopping:
            self.open(conn)

    def _on_channel_open(self, ch: Any) -> None:
        if self.rt.stopping:
            ch.close()
            return
        self.channel = ch
        ch.add_on_close_callback(self._on_channel_closed)
        with self.lock:
            acts = self.core.channel_opened()
        for a in acts:
            if isinstance(a, TxSelect):
                ch.tx_select()
        prefetch = self.spec.policy.prefetch
        ch.basic_qos(prefetch_count=prefetch, callback=lambda _f: self._consume(ch))

    def _consume(self, ch: Any) -> None:
        self.cancelled.clear()
        self.consumer_tag = ch.basic_consume(
            self.spec.queue, self._on_message, auto_ack=self.no_ack
        )
        self.rt.consumer_ready(self)

    def _on_channel_closed(self, ch: Any, reason: BaseException) -> None:
        if ch is not self.channel:
            return
        with self.lock:
            lost = self.core.channel_closed()
        self.channel = None
        self.cancelled.set()
        if lost:
            log.info(
                "%s: channel closed with %d deliveries unsettled (broker requeues them)",
                self.spec.name,
                lost,
            )
        code = getattr(reason, "reply_code", 0)
        if code not in (0, 200, 320):
            log.error("%s: channel closed by broker: %s", self.spec.name, reason)
        conn = self.rt.connection
        if not self.rt.stopping and conn is not None and conn.is_open:
            conn.ioloop.call_later(1.0, lambda: self._reopen(conn))

    def _on_message(self, ch: Any, method: Any, props: Any, body: bytes) -> None:
        exchange, rk = frames.text(method.exchange), frames.text(method.routing_key)
        why = frames.unreadable(method, props)
        with self.lock:
            try:
                t = self.core.receive(
                    method.delivery_tag,
                    method.redelivered,
                    None if why else props.headers,
                    exchange,
                    rk,
                    None if why else props.message_id,
                    unreadable=why,
                )
            except Exception as exc:  # never let one delivery take the connection down
                why = f"receiving it failed: {describe(exc)}"
                t = self.core.receive(
                    method.delivery_tag, method.redelivered, None, exchange, rk, unreadable=why
                )
        d = Delivery(
            body,
            props,
            t,
            self,
            exchange=exchange,
            routing_key=rk,
            redelivered=method.redelivered,
            queue=self.spec.queue,
            decoder=self.binding.decoder,
        )
        if t.verdict is not None:
            with self.lock:
                self.outbox.append((t.generation, t.verdict))
            self.flush()
            return
        self.inbox.put(d)

    def tick(self) -> None:
        if self.channel is None:
            return
        with self.lock:
            acts = self.core.tick()
            if acts:
                self.outbox.append((self.core.generation, acts))
        self.flush()

    def flush(self) -> None:
        """Carry out the queued actions, oldest first (I/O thread only)."""
        if self._flushing:
            return  # called from inside execute(): the running loop picks them up
        self._flushing = True
        try:
            while True:
                with self.lock:
                    if not self.outbox:
                        return
                    gen, acts = self.outbox.popleft()
                self.execute(gen, acts)
        finally:
            self._flushing = False

    def execute(self, gen: int, acts: list[Action]) -> None:
        """Carry out actions on the channel of generation `gen` (I/O thread only)."""
        ch = self.channel
        conn = self.rt.connection
        if (
            ch is None
            or not ch.is_open
            or conn is None
            or not conn.is_open  # going down: its channels close next, their tags are stale
            or gen != self.core.generation
            or not self.core.open
        ):
            if any(not isinstance(a, Republish) for a in acts):
                log.info(
                    "%s: dropped %d settle actions for a closed channel", self.spec.name, len(acts)
                )
            return
        try:
            for a in acts:
                if type(a) is Ack:
                    ch.basic_ack(a.tag, a.multiple)
                elif type(a) is Reject:
                    ch.basic_reject(a.tag, a.requeue)
                elif type(a) is Nack:
                    ch.basic_nack(a.tag, a.multiple, a.requeue)
                elif type(a) is Republish:
                    self.rt.publisher.publish(self, gen, a)
                elif type(a) is TxCommit:
                    ch.tx_commit()
                elif type(a) is TxSelect:
                    ch.tx_select()
        except (pika.exceptions.ChannelWrongStateError, pika.exceptions.ConnectionWrongStateError):
            # Closed under us: the broker requeues what was not settled; the close
            # callback that follows marks the generation stale.
            log.info("%s: channel closed while settling", self.spec.name)

    def republished(self, gen: int, token: int, ok: bool, unroutable: bool = False) -> None:
        with self.lock:
            acts = self.core.republished(token, ok, unroutable=unroutable)
            if acts:
                self.outbox.append((self.core.generation, acts))
        self.flush()

    def republish_failed(self, token: int, why: str) -> None:
        """The copy could not be sent (I/O thread): the core decides what now."""
        with self.lock:
            acts = self.core.republished(token, False, error=why)
            if acts:
                self.outbox.append((self.core.generation, acts))
        self.flush()

    # -- worker threads --------------------------------------------------------

    def send(self, gen: int, acts: list[Action]) -> None:
        """From a worker thread, holding `self.lock` right after the core decided `acts`:
        queue them for the I/O thread.

        Frames must reach the channel in the order the core decided them: a straggler's
        single ack overtaken by a later multiple-ack that covers it would be an unknown
        delivery tag to the broker (it closes the channel), and a requeue overtaken by
        such an ack would ack a message that was meant to go back to the queue.
        """
        self.outbox.append((gen, acts))
        self.rt.call_soon(self.flush)

    def settle(self, delivery: Delivery, kind: str, requeue: bool, multiple: bool) -> None:
        """Delivery.ack()/nack()/reject() from a handler (Settler protocol)."""
        with self.lock:
            acts = self.core.settle(delivery.tracked, kind, requeue=requeue, multiple=multiple)
            if acts:
                self.send(self.core.generation, acts)

    def start_workers(self) -> None:
        for i in range(self.spec.concurrency):
            th = threading.Thread(
                target=self._worker, name=f"ackkit-{self.spec.name}-{i}", daemon=True
            )
            th.start()
            self.workers.append(th)

    def _worker(self) -> None:
        try:
            if self.spec.batch_size:
                self._take_batches()
            else:
                self._take_one_by_one()
        except BaseException as exc:  # a bug of ours: stop visibly, never a silent zombie
            self.rt.fail(exc, f"{self.spec.name}: worker thread failed")

    def _take_one_by_one(self) -> None:
        inbox = self.inbox
        while True:
            d = inbox.get()
            if d is None:
                return
            self._run([d])

    def _take_batches(self) -> None:
        size = self.spec.batch_size or 1
        timeout = self.spec.batch_timeout
        while True:
            first = self.inbox.get()
            if first is None:
                return
            batch = [first]
            deadline = time.monotonic() + timeout
            while len(batch) < size:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                try:
                    nxt = self.inbox.get(timeout=left)
                except _queue.Empty:
                    break
                if nxt is None:
                    self.inbox.put(None)
                    break
                batch.append(nxt)
            self._run(batch)

    def _run(self, ds: list[Delivery]) -> None:
        """Run the handler for `ds` (one delivery, or a batch) until the core is done with it."""
        if self.rt.stopping:
            self.rt.unstarted.extend(ds)
            return
        with self.lock:  # a delivery whose channel closed while it waited: requeued already
            ds = [d for d in ds if self.core.startable(d.tracked)]
        if not ds:
            return
        inv = Invocation(self.binding, ds)
        while True:
            out = self._attempt(inv)
            if not out.rerun:
                return
            inv = inv.again(out.rerun)
            if self.rt.stop_event.wait(out.delay):  # stopping during the backoff
                self._release(out.rerun)
                return

    def _attempt(self, inv: Invocation) -> Outcome:
        """Call the handler once, then carry out what the core makes of it."""
        result: object = None
        exc: BaseException | None = None
        ds = inv.deliveries
        done = self.probe(ds) if self.probe is not None and ds else None
        self.in_handler += 1
        try:
            if ds:
                result = self.binding.fn(*inv.args())
        except BaseException as e:  # SystemExit and KeyboardInterrupt too: settled, then stop
            exc = e  # the core formats the traceback if it dead-letters
        finally:
            self.in_handler -= 1
        if done is not None:
            done(exc)
        if exc is not None:
            self.failures.failed(self.spec.name, inv, exc)  # before the core moves attempt
        with self.lock:
            out = inv.outcome(self.core, result, exc)
            if out.actions:
                self.send(self.core.generation, out.actions)
        if out.stop is not None:
            self.rt.fail(out.stop, f"{self.spec.name}: handler raised {type(out.stop).__name__}")
        return out

    def _release(self, ts: Sequence[Tracked]) -> None:
        with self.lock:
            acts = [a for t in ts for a in self.core.release(t)]
            if acts:
                self.send(self.core.generation, acts)


class Publisher:
    """A confirm-mode channel for republishes (retry delays, dead letters)."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.channel: Any = None
        self.seq = 0
        self.pending: dict[int, tuple[Consumer, int, int, str]] = {}
        self.returned: set[int] = set()
        self.waiting: list[tuple[Consumer, int, Republish]] = []

    def open(self, conn: Any) -> None:
        conn.channel(on_open_callback=self._on_open)

    def _reopen(self, conn: Any) -> None:
        if conn.is_open and not self.rt.stopping:
            self.open(conn)

    def _on_open(self, ch: Any) -> None:
        ch.add_on_close_callback(self._on_closed)
        ch.add_on_return_callback(self._on_return)
        ch.confirm_delivery(self._on_confirm, callback=lambda _f: self._ready(ch))

    def _ready(self, ch: Any) -> None:
        self.channel = ch
        self.seq = 0
        waiting, self.waiting = self.waiting, []
        for c, gen, a in waiting:
            self.publish(c, gen, a)

    def publish(self, c: Consumer, gen: int, a: Republish) -> None:
        with c.lock:
            current = c.core.publishable(a.token)
        if not current:  # the original's channel closed since: the broker requeued it
            c.republished(gen, a.token, False)
            return
        ch = self.channel
        if ch is None or not ch.is_open:
            self.waiting.append((c, gen, a))
            return
        if a.declare is not None:
            name, args = a.declare
            plain = dataclasses.replace(a, declare=None)
            ch.queue_declare(
                name, durable=True, arguments=args, callback=lambda _f: self.publish(c, gen, plain)
            )
            return
        d: Delivery = a.source
        try:
            props = copy_properties(
                None if a.minimal else d.properties, a.set_headers, **copy_options(a, ch)
            )
            ch.basic_publish(a.exchange, a.routing_key, d.body, props, mandatory=True)
        except Exception as exc:  # never lose the I/O thread over one copy
            why = f"{a.purpose} copy not publishable: {short(exc)}"
            log.error("%s: %s", c.spec.name, why)
            c.republish_failed(a.token, why)
            return
        self.seq += 1
        self.pending[self.seq] = (c, gen, a.token, a.routing_key)

    def _on_return(self, ch: Any, method: Any, props: Any, body: bytes) -> None:
        for seq, (_c, _g, _t, rk) in self.pending.items():
            if rk == method.routing_key and seq not in self.returned:
                self.returned.add(seq)
                break
        log.warning(
            "republish to %r returned by the broker: %s (an ackkit queue is declared again "
            "and the copy republished; otherwise the original is requeued)",
            method.routing_key,
            method.reply_text,
        )

    def _on_confirm(self, frame: Any) -> None:
        m = frame.method
        ok = isinstance(m, Basic.Ack)
        tags = [s for s in self.pending if s <= m.delivery_tag] if m.multiple else [m.delivery_tag]
        for s in tags:
            entry = self.pending.pop(s, None)
            if entry is None:
                continue
            c, gen, token, _rk = entry
            returned = s in self.returned
            c.republished(gen, token, ok and not returned, unroutable=returned)
            self.returned.discard(s)

    def _on_closed(self, ch: Any, reason: BaseException) -> None:
        self.channel = None
        conn = self.rt.connection
        if conn is None or not conn.is_open:
            # The whole connection is going down (pika closes its channels in number
            # order, this one first): the consumers' channels are gone as well, so
            # their deliveries are stale before the unconfirmed copies are reported.
            self.rt.channels_lost(reason)
        pending, self.pending = self.pending, {}
        self.returned.clear()
        for c, gen, token, _rk in pending.values():
            c.republished(gen, token, False)
        conn = self.rt.connection
        if not self.rt.stopping and conn is not None and conn.is_open:
            log.warning("publisher channel closed: %s; reopening", reason)
            conn.ioloop.call_later(0.5, lambda: self._reopen(conn))


class Runtime:
    """Runs the listeners of an App until stopped; reconnects with backoff."""

    def __init__(self, app: Any) -> None:
        self.app = app
        obs = app._observer()
        self.consumers = [Consumer(self, s, obs) for s in app.specs]
        self.publisher = Publisher(self)
        self.connection: Any = None
        self.stopping = False
        self.stop_event = threading.Event()
        self.ready = threading.Event()
        self.fatal: BaseException | None = None
        self.unstarted: list[Delivery] = []
        self._thread: threading.Thread | None = None
        self._ready_count = 0
        self._opened = False
        self._close_reason = ""
        self._done = threading.Event()
        self._stop_lock = threading.Lock()

    # -- lifecycle (caller's thread) -------------------------------------------

    def start(self) -> None:
        for c in self.consumers:
            c.start_workers()
        self._thread = threading.Thread(target=self._io_main, name="ackkit-io", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + self.app.startup_timeout
        while not self.ready.wait(0.05):
            if self.fatal is not None:
                self._join_workers(0)
                raise self.fatal
            if time.monotonic() > deadline:
                self.stop()
                raise ConnectFailed(
                    f"no connection to {self.app.safe_url} within {self.app.startup_timeout} s"
                )

    def fail(self, exc: BaseException, what: str) -> None:
        """Something that must not go on quietly: a failure of ackkit's own threads, or a
        handler that raised an interpreter-exit signal. The app stops (its deliveries
        settled or left to the broker to requeue), `run()` raises `exc`, `is_running`
        turns False; never a listener that looks alive and consumes nothing."""
        if self.fatal is None:
            self.fatal = exc
        if isinstance(exc, EXIT_SIGNALS):
            log.error("%s; stopping the app", what)
        else:
            log.error("%s: %s; stopping the app", what, short(exc), exc_info=exc)
        if not self.stopping:
            threading.Thread(target=self.stop, name="ackkit-stop", daemon=True).start()

    def stop(self, timeout: float | None = None) -> None:
        """Graceful: cancel consumers, finish handlers, return unstarted, flush acks, close."""
        with self._stop_lock:  # one shutdown, whoever asks (app.stop(), fail())
            self._stop(timeout)

    def _stop(self, timeout: float | None) -> None:
        if self.stopping and self._done.is_set():
            return
        timeout = self.app.shutdown_timeout if timeout is None else timeout
        self.stopping = True
        self.stop_event.set()
        conn = self.connection
        if conn is not None and conn.is_open:
            self.call_soon(self._cancel_all)
            for c in self.consumers:
                c.cancelled.wait(5.0)
        for c in self.consumers:
            while True:
                try:
                    d = c.inbox.get_nowait()
                except _queue.Empty:
                    break
                if d is not None:
                    self.unstarted.append(d)
        self._join_workers(timeout)
        if conn is not None and conn.is_open:
            flushed = threading.Event()
            self.call_soon(lambda: self._finish_io(flushed))
            flushed.wait(10.0)
        self._done.set()
        if self._thread is not None:
            self._thread.join(10.0)

    def _join_workers(self, timeout: float) -> None:
        for c in self.consumers:
            for _ in c.workers:
                c.inbox.put(None)
        deadline = time.monotonic() + timeout
        for c in self.consumers:
            for th in c.workers:
                th.join(max(0.0, deadline - time.monotonic()))
                if th.is_alive():
                    log.warning(
                        "%s: a handler is still running after %.0f s; its delivery "
                        "is requeued by the broker when the channel closes",
                        c.spec.name,
                        timeout,
                    )

    # -- I/O thread ------------------------------------------------------------

    def call_soon(self, fn: Callable[[], None]) -> None:
        conn = self.connection
        if conn is not None:
            try:
                conn.ioloop.add_callback_threadsafe(fn)
            except Exception:  # its loop is closed: the broker requeues what was unsettled
                log.debug("ackkit: I/O loop closed; dropped a callback", exc_info=True)

    def _io_main(self) -> None:
        try:
            while not self.stopping:
                retrying = Retrying(
                    wait=reconnect_wait(self.app.reconnect_max_interval),
                    retry=retry_if_exception_type(ConnectFailed),
                    reraise=True,
                    before_sleep=reconnect_logger(self.app.safe_url),
                )
                for attempt in retrying:
                    with attempt:
                        if self.stopping:
                            return
                        self._serve()
        except (FatalConnectError, TopologyConflict) as exc:
            self.fatal = exc
        except BaseException as exc:  # a bug of ours: surfaced to start() / run()
            self.fail(exc, "ackkit I/O thread failed")
        finally:
            self._done.set()

    def _serve(self) -> None:
        """One connection's life. Raises ConnectFailed if it never opened."""
        params = parameters(
            self.app.url,
            heartbeat=self.app.heartbeat,
            name=self.app.connection_name,
            tls=self.app.tls,
        )
        self._topology(params)
        self._opened = False
        self._ready_count = 0
        conn = FaithfulConnection(
            params,
            on_open_callback=self._on_open,
            on_open_error_callback=self._on_open_error,
            on_close_callback=self._on_close,
        )
        self.connection = conn
        try:
            conn.ioloop.start()
        finally:
            conn.ioloop.close()
        if not self._opened:
            raise ConnectFailed(self._close_reason)
        if not self.stopping:
            log.warning(
                "ackkit: connection to %s lost (%s); reconnecting",
                self.app.safe_url,
                self._close_reason,
            )

    def _topology(self, params: Any) -> None:
        try:
            conn = blocking_connection(params)
        except pika.exceptions.ProbableAuthenticationError as exc:
            raise FatalConnectError(
                f"authentication failed for {self.app.safe_url}: {exc}"
            ) from None
        except pika.exceptions.ProbableAccessDeniedError as exc:
            raise FatalConnectError(f"access denied on {self.app.safe_url}: {exc}") from None
        except (pika.exceptions.AMQPConnectionError, ssl.SSLError) as exc:
            bad_tls = tls_failure(exc, self.app.url)
            if bad_tls is not None:
                raise FatalConnectError(bad_tls) from None
            raise ConnectFailed(mask_text(repr(exc)) + handshake_hint(exc, self.app.url)) from None
        try:
            own = [q for c in self.consumers for q in c.core.topology()]
            user = [
                (c.spec.queue, c.spec.queue_arguments) for c in self.consumers if c.spec.declare
            ]
            existing = [c.spec.queue for c in self.consumers if not c.spec.declare]
            declare_queues(conn, own, user, existing)  # TopologyConflict: fatal, from start()
        except pika.exceptions.AMQPError as exc:
            raise ConnectFailed(mask_text(repr(exc))) from None
        finally:
            if conn.is_open:
                conn.close()

    def _on_open(self, conn: Any) -> None:
        self._opened = True
        self.publisher.open(conn)
        for c in self.consumers:
            c.open(conn)
        conn.ioloop.call_later(TICK, self._tick)

    def consumer_ready(self, c: Consumer) -> None:
        self._ready_count += 1
        if self._ready_count >= len(self.consumers):
            self.ready.set()

    def _on_open_error(self, conn: Any, err: BaseException) -> None:
        self._close_reason = mask_text(repr(err))
        conn.ioloop.stop()

    def channels_lost(self, reason: BaseException) -> None:
        """Every consumer channel is gone (the connection closed)."""
        for c in self.consumers:
            if c.channel is not None:
                c._on_channel_closed(c.channel, reason)

    def _on_close(self, conn: Any, reason: BaseException) -> None:
        self._close_reason = mask_text(repr(reason))
        self.channels_lost(reason)
        if self.publisher.channel is not None:
            self.publisher._on_closed(self.publisher.channel, reason)
        conn.ioloop.stop()

    def _tick(self) -> None:
        conn = self.connection
        for c in self.consumers:
            c.tick()
        if conn is not None and conn.is_open:
            conn.ioloop.call_later(TICK, self._tick)

    def _cancel_all(self) -> None:
        for c in self.consumers:
            ch = c.channel
            if ch is not None and ch.is_open and c.consumer_tag:
                ch.basic_cancel(c.consumer_tag, callback=lambda _f, c=c: c.cancelled.set())
            else:
                c.cancelled.set()

    def _finish_io(self, flushed: threading.Event) -> None:
        for d in self.unstarted:
            c = next(c for c in self.consumers if d._settler is c)
            with c.lock:
                c.outbox.append((d.tracked.generation, c.core.release(d.tracked)))
            c.flush()
        self.unstarted.clear()
        for c in self.consumers:
            with c.lock:
                c.outbox.append((c.core.generation, c.core.drain()))
            c.flush()
        self._await_confirms(flushed, time.monotonic() + 5.0)

    def _await_confirms(self, flushed: threading.Event, deadline: float) -> None:
        conn = self.connection
        if self.publisher.pending and time.monotonic() < deadline and conn.is_open:
            conn.ioloop.call_later(0.02, lambda: self._await_confirms(flushed, deadline))
            return
        for c in self.consumers:
            with c.lock:
                c.outbox.append((c.core.generation, c.core.drain()))
            c.flush()
        if conn.is_open:
            conn.close()
        flushed.set()
