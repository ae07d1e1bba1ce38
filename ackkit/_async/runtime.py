"""The aio-pika runtime: one event loop, the listener cores called without locks.

Every decision comes from the listener's `ListenerCore`; this module only
carries the actions out on aiormq channels (aio-pika's transport):

* Deliveries arrive through `basic_consume` on the listener's own channel.
  aiormq already runs each consumer callback as a task of that channel, so a
  delivery costs no extra task here: the callback runs the handler itself when
  a concurrency slot is free, else parks the delivery in a backlog that the
  running callbacks work off in delivery order.
* Tags are fenced by channel generation: every action list is executed only if
  the core's generation is still the one it was decided for and the channel
  object is the one of that generation; the check is repeated after every
  await. Channel numbers are never reused on a connection, so a frame queued
  for a closed channel cannot reach its successor.
* Handlers complete out of order with `max_concurrency` > 1. The core's window
  then acks the contiguous settled prefix with one multiple-ack and, at flush
  time (count, `tick()` interval, drain), acks stragglers behind an unfinished
  delivery one by one: a multiple-ack never covers a delivery still in a
  handler, and acked work is not held back by one slow handler.
* A lost channel cancels the handler tasks of its deliveries (aiormq cancels a
  channel's tasks on close): the broker has requeued those deliveries and
  their outcome could no longer be acknowledged anyway. Cancellation is never
  a failure: the delivery is released (requeued), not retried or dead-lettered.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import time
import traceback
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, cast

import aio_pika
import aiormq.exceptions
from aiormq.abc import AbstractChannel, AbstractConnection, DeliveredMessage
from tenacity import AsyncRetrying, retry_if_exception_type

from .._core.actions import Action, Republish, TxCommit, TxSelect
from .._core.errors import TopologyConflict
from .._core.events import Observer
from .._core.listener import ListenerCore
from .._core.outcome import EXIT_SIGNALS, Outcome
from .._core.policy import AckMode
from .._delivery import Delivery
from .._invocation import Invocation
from .._io import TICK, ConnectFailed, FatalConnectError, reconnect_logger, reconnect_wait
from .._logs import FailureLog, short
from .._spec import ListenerSpec
from .._url import mask_text
from .._wire import describe
from . import _frames as frames
from ._amqp import (
    CHANNEL_GONE,
    ChannelNumbers,
    declare_queues,
    open_connection,
    publish_copy,
    send_settles,
)
from .delivery import AsyncDelivery

if TYPE_CHECKING:
    from .app import AsyncApp

log = logging.getLogger("ackkit")
CANCEL_TIMEOUT = 5.0
CONFIRM_TIMEOUT = 5.0
CHANNEL_REOPEN_DELAY = 1.0

Unit = Delivery | list[Delivery]
"""What one handler invocation gets: a delivery, or a batch of them."""


class AsyncConsumer:
    """One listener on one channel (re-opened as a new generation after a loss).

    Implements both settler protocols: `asettle` for AsyncDelivery (async
    handlers), `settle` for the plain Delivery of a `def` handler running in
    the listener's thread pool (it hands the settle to the loop and waits).
    """

    def __init__(self, rt: AsyncRuntime, spec: ListenerSpec, observer: Observer | None) -> None:
        self.rt = rt
        self.spec = spec
        self.core = ListenerCore(spec.policy, observer=observer)
        self.binding = spec.binding
        self.is_async = spec.binding.is_async
        self.delivery_cls = AsyncDelivery if self.is_async else Delivery
        self.no_ack = spec.policy.mode is AckMode.NONE
        self.queue = spec.queue
        self.limit = spec.concurrency
        self.channel: AbstractChannel | None = None
        self.consumer_tag: str | None = None
        self.running = 0
        self.backlog: deque[Unit] = deque()
        self.tasks: set[asyncio.Task[Any]] = set()
        self.batch_size = spec.batch_size or 0
        self.batch_buf: list[Delivery] = []
        self.batch_timer: asyncio.TimerHandle | None = None
        self.pool: ThreadPoolExecutor | None = None
        self._opening = False
        # Settle frames leave in the order the core decided them (asyncio.Lock is FIFO and
        # every caller enters execute() right after deciding, without awaiting in between).
        self.settling = asyncio.Lock()
        self.failures = FailureLog(log)
        self.probe = rt.app._instrument(spec, self.core)  # metrics, tracing: None when off
        if not self.is_async:
            self.pool = ThreadPoolExecutor(
                max_workers=spec.concurrency, thread_name_prefix=f"ackkit-{spec.name}"
            )

    # -- channel lifecycle -------------------------------------------------------

    async def open(self, conn: AbstractConnection, numbers: ChannelNumbers) -> None:
        if self._opening or (self.channel is not None and not self.channel.is_closed):
            return
        self._opening = True
        try:
            ch = await conn.channel(numbers.take(), publisher_confirms=False)
            if self.rt.stopping:
                await ch.close()
                return
            acts = self.core.channel_opened()
            self.channel = ch
            ch.closing.add_done_callback(functools.partial(self._on_channel_closed, ch))
            if any(type(a) is TxSelect for a in acts):
                await ch.tx_select()
            await ch.basic_qos(prefetch_count=self.spec.policy.prefetch)
            ok = await ch.basic_consume(self.queue, self._on_message, no_ack=self.no_ack)
            self.consumer_tag = ok.consumer_tag
        finally:
            self._opening = False

    def _on_channel_closed(self, ch: AbstractChannel, fut: asyncio.Future[Any]) -> None:
        reason = None if fut.cancelled() else fut.exception()
        if ch is not self.channel:
            return
        self.lost(reason)
        conn = self.rt.amqp
        if not self.rt.stopping and conn is not None and not conn.is_closed:
            if isinstance(reason, aiormq.exceptions.ChannelClosed):
                log.error("%s: channel closed by the broker: %s", self.spec.name, short(reason))
            self.rt.spawn(self._reopen_later(conn))

    def lost(self, reason: BaseException | None) -> None:
        """The channel is gone: its tags are stale, its unstarted deliveries too."""
        if self.channel is None:
            return
        lost = self.core.channel_closed()
        self.channel = None
        self.consumer_tag = None
        self.backlog.clear()  # their tags died with the channel; the broker requeued them
        self.batch_buf = []
        if self.batch_timer is not None:
            self.batch_timer.cancel()
            self.batch_timer = None
        if lost:
            log.info(
                "%s: channel closed with %d deliveries unsettled (broker requeues them)",
                self.spec.name,
                lost,
            )

    async def _reopen_later(self, conn: AbstractConnection) -> None:
        await asyncio.sleep(CHANNEL_REOPEN_DELAY)
        if self.rt.stopping or self.rt.amqp is not conn or conn.is_closed:
            return
        try:
            await self.open(conn, self.rt.numbers)
        except (TimeoutError, *CHANNEL_GONE) as exc:
            log.warning("%s: reopening the channel failed: %s", self.spec.name, short(exc))
            if self.channel is None:
                self.rt.spawn(self._reopen_later(conn))

    async def cancel(self) -> None:
        ch, tag = self.channel, self.consumer_tag
        if ch is None or ch.is_closed or tag is None:
            return
        with contextlib.suppress(*CHANNEL_GONE, TimeoutError):
            await ch.basic_cancel(tag, timeout=CANCEL_TIMEOUT)
        self.consumer_tag = None

    # -- deliveries ----------------------------------------------------------------

    async def _on_message(self, msg: DeliveredMessage) -> None:
        """aiormq's consumer callback (already a task of the channel)."""
        try:
            await self._deliver(msg)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # a bug of ours: stop visibly, never a silent zombie
            self.rt.fail(exc, f"{self.spec.name}: delivery task failed")

    async def _deliver(self, msg: DeliveredMessage) -> None:
        if msg.channel is not self.channel:
            return  # a late delivery of a closed channel: the broker requeued it
        dv: Any = msg.delivery
        props = msg.header.properties
        core = self.core
        exchange = dv.exchange or ""
        rk = dv.routing_key or ""
        redelivered = bool(dv.redelivered)
        why = frames.unreadable(msg.channel.connection, msg.channel.number, dv.delivery_tag)
        try:
            t = core.receive(
                dv.delivery_tag,
                redelivered,
                None if why else props.headers,
                exchange,
                rk,
                None if why else props.message_id,
                unreadable=why,
            )
        except Exception as exc:  # never let one delivery stop the queue
            why = f"receiving it failed: {describe(exc)}"
            t = core.receive(dv.delivery_tag, redelivered, None, exchange, rk, unreadable=why)
        d = self.delivery_cls(
            msg.body,
            props,
            t,
            self,
            exchange=exchange,
            routing_key=rk,
            redelivered=redelivered,
            queue=self.queue,
            decoder=self.binding.decoder,
        )
        if t.verdict is not None:
            await self.execute(t.generation, t.verdict)
            return
        if self.rt.stopping:
            await self.release([d])
            return
        unit: Unit = d
        if self.batch_size:
            batch = self._batch_add(d)
            if batch is None:
                return
            unit = batch
        if self.running >= self.limit:
            self.backlog.append(unit)
            return
        await self._run(unit)

    async def _run(self, unit: Unit) -> None:
        """Run a handler for `unit`, then for backlog items while there are any."""
        self.running += 1
        task = asyncio.current_task(self.rt.loop)
        if task is not None:
            self.tasks.add(task)
        try:
            while True:
                await self._handle(unit if isinstance(unit, list) else [unit])
                if not self.backlog or self.rt.stopping:
                    return
                unit = self.backlog.popleft()
        finally:
            self.running -= 1
            if task is not None:
                self.tasks.discard(task)

    async def _handle(self, ds: list[Delivery]) -> None:
        """Run the handler for `ds` (one delivery, or a batch) until the core is done with it."""
        inv = Invocation(self.binding, ds)
        try:
            while True:
                out = await self._attempt(inv)
                if not out.rerun:
                    return
                inv = inv.again(out.rerun)
                if await self.rt.pause(out.delay):  # stopping during the backoff
                    await self.release(inv.deliveries)
                    return
        except asyncio.CancelledError:  # shutdown or a lost channel: requeue, not a failure
            await self.release(inv.deliveries)
            raise

    async def _attempt(self, inv: Invocation) -> Outcome:
        """Call the handler once, then carry out what the core makes of it."""
        b = self.binding
        result: object = None
        exc: BaseException | None = None
        tb = None
        ds = inv.deliveries
        done = self.probe(ds) if self.probe is not None and ds else None
        try:
            if not ds:
                pass
            elif self.is_async:
                result = await b.fn(*inv.args())
            else:
                result = await self.rt.loop.run_in_executor(self.pool, _call, b.fn, inv.args)
        except asyncio.CancelledError as e:  # released by _handle, not a failure
            if done is not None:
                done(e)
            raise
        except BaseException as e:  # SystemExit and KeyboardInterrupt too: settled, then stop
            exc = e
            tb = traceback.format_exc()
            self.failures.failed(self.spec.name, inv, e)  # before the core moves attempt
        if done is not None:
            done(exc)
        core = self.core
        out = inv.outcome(core, result, exc, tb)
        if out.actions:
            await self.execute(core.generation, out.actions)
        if out.stop is not None:
            self.rt.fail(out.stop, f"{self.spec.name}: handler raised {type(out.stop).__name__}")
        return out

    def _batch_add(self, d: Delivery) -> list[Delivery] | None:
        buf = self.batch_buf
        buf.append(d)
        if len(buf) >= self.batch_size:
            self.batch_buf = []
            if self.batch_timer is not None:
                self.batch_timer.cancel()
                self.batch_timer = None
            return buf
        if len(buf) == 1:
            self.batch_timer = self.rt.loop.call_later(self.spec.batch_timeout, self._batch_due)
        return None

    def _batch_due(self) -> None:
        self.batch_timer = None
        buf, self.batch_buf = self.batch_buf, []
        if not buf:
            return
        if self.rt.stopping:
            self.rt.spawn(self.release(buf))
        elif self.running >= self.limit:
            self.backlog.append(buf)
        else:
            self.rt.spawn(self._run(buf))

    async def release(self, ds: list[Delivery]) -> None:
        """Requeue deliveries whose handler never ran to the end (shutdown)."""
        core = self.core
        acts: list[Action] = []
        for d in ds:
            acts.extend(core.release(d.tracked))
        if acts:
            await self.execute(core.generation, acts)

    async def release_unstarted(self) -> None:
        units = list(self.backlog)
        self.backlog.clear()
        if self.batch_buf:
            units.append(self.batch_buf)
            self.batch_buf = []
        if self.batch_timer is not None:
            self.batch_timer.cancel()
            self.batch_timer = None
        ds = [d for u in units for d in (u if isinstance(u, list) else [u])]
        if ds:
            await self.release(ds)

    # -- settling ------------------------------------------------------------------

    async def execute(self, gen: int, acts: list[Action]) -> None:
        """Carry out actions on the channel of generation `gen`, or drop them.

        One at a time, in decision order: a straggler's single ack overtaken (while it
        waits for room in the connection's write queue) by a later multiple-ack that
        covers it is an unknown delivery tag, and the broker closes the channel.
        """
        async with self.settling:
            await self._execute(gen, acts)

    async def _execute(self, gen: int, acts: list[Action]) -> None:
        core = self.core
        ch = self.channel
        for a in acts:
            if ch is None or ch is not self.channel or ch.is_closed or gen != core.generation:
                if any(type(x) is not Republish for x in acts):
                    log.info(
                        "%s: dropped %d settle actions for a closed channel",
                        self.spec.name,
                        len(acts),
                    )
                return
            ta = type(a)
            try:
                if ta is Republish:
                    self.rt.publisher.submit(self, cast(Republish, a))
                elif ta is TxCommit:
                    await ch.tx_commit()
                elif ta is TxSelect:
                    await ch.tx_select()
                else:
                    await send_settles(ch, (a,))
            except CHANNEL_GONE as exc:
                log.info("%s: channel lost while settling: %s", self.spec.name, short(exc))
                return

    async def asettle(self, delivery: Delivery, kind: str, requeue: bool, multiple: bool) -> None:
        """`await AsyncDelivery.ack()/nack()/reject()` (AsyncSettler protocol)."""
        core = self.core
        acts = core.settle(delivery.tracked, kind, requeue=requeue, multiple=multiple)
        if acts:
            await self.execute(core.generation, acts)

    def settle(self, delivery: Delivery, kind: str, requeue: bool, multiple: bool) -> None:
        """`Delivery.ack()` from a `def` handler in the thread pool (Settler protocol)."""
        loop = self.rt.loop
        try:
            current = asyncio.get_running_loop()
        except RuntimeError:
            current = None
        if current is loop:
            raise RuntimeError(
                "a blocking Delivery.ack() on the event loop would deadlock; "
                "async handlers get an AsyncDelivery: use `await delivery.ack()`"
            )
        coro = self.asettle(delivery, kind, requeue, multiple)
        asyncio.run_coroutine_threadsafe(coro, loop).result()

    async def tick(self) -> None:
        core = self.core
        if self.channel is None or not core.open:
            return
        acts = core.tick()
        if acts:
            await self.execute(core.generation, acts)

    async def drain(self) -> None:
        core = self.core
        acts = core.drain()
        if acts:
            await self.execute(core.generation, acts)


def _call(fn: Any, args: Any) -> Any:
    return fn(*args())


class AsyncPublisher:
    """A confirm-mode channel for republishes (retry delays, dead letters)."""

    def __init__(self, rt: AsyncRuntime) -> None:
        self.rt = rt
        self.channel: AbstractChannel | None = None
        self.lock = asyncio.Lock()
        self.pending: set[asyncio.Task[None]] = set()
        self.declaring: dict[str, asyncio.Future[None]] = {}

    def submit(self, c: AsyncConsumer, a: Republish) -> None:
        task = self.rt.loop.create_task(self._publish(c, a))
        self.pending.add(task)
        task.add_done_callback(self.pending.discard)

    async def _channel(self) -> AbstractChannel:
        async with self.lock:
            ch = self.channel
            if ch is None or ch.is_closed:
                conn = self.rt.amqp
                if conn is None or conn.is_closed:
                    raise ConnectionError("not connected")
                ch = await conn.channel(self.rt.numbers.take(), publisher_confirms=True)
                self.channel = ch
            return ch

    async def _publish(self, c: AsyncConsumer, a: Republish) -> None:
        ok = unroutable = False
        error: str | None = None
        try:
            ch = await self._channel()
            if a.declare is not None:
                a = await self._declare(ch, a)
            else:
                pending = self.declaring.get(a.routing_key)
                if pending is not None:  # its queue is being declared: publish after that
                    await asyncio.shield(pending)
            if c.core.publishable(a.token):  # else its channel closed while we waited
                ok, unroutable, error = await publish_copy(ch, a)
        except (TimeoutError, *CHANNEL_GONE) as exc:
            log.warning("republish to %r failed: %s", a.routing_key, short(exc))
        except Exception as exc:  # the original must still be settled
            log.exception("republish to %r failed", a.routing_key)
            error = f"{a.purpose} copy not publishable: {short(exc)}"
        core = c.core
        acts = core.republished(a.token, ok, unroutable=unroutable, error=error)
        if acts:
            await c.execute(core.generation, acts)

    async def _declare(self, ch: AbstractChannel, a: Republish) -> Republish:
        """Declare the queue a Republish asks for, once at a time per queue; publishes
        to it wait for that declare (frames of concurrent tasks are not ordered)."""
        assert a.declare is not None
        name, args = a.declare
        pending = self.declaring.get(name)
        if pending is not None:
            await asyncio.shield(pending)
            return dataclasses.replace(a, declare=None)
        done = self.declaring[name] = self.rt.loop.create_future()
        try:
            await ch.queue_declare(name, durable=True, arguments=args or None)
        finally:
            done.set_result(None)
            if self.declaring.get(name) is done:
                del self.declaring[name]
        return dataclasses.replace(a, declare=None)

    async def wait(self, timeout: float) -> None:
        if self.pending:
            await asyncio.wait(set(self.pending), timeout=timeout)


class AsyncRuntime:
    """Runs the listeners of an AsyncApp until stopped; reconnects with backoff."""

    def __init__(self, app: AsyncApp) -> None:
        self.app = app
        self.loop = asyncio.get_running_loop()
        obs = app._observer()
        self.consumers = [AsyncConsumer(self, s, obs) for s in app.specs]
        self.publisher = AsyncPublisher(self)
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

    def spawn(self, coro: Any) -> asyncio.Task[Any]:
        task: asyncio.Task[Any] = self.loop.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    def fail(self, exc: BaseException, what: str) -> None:
        """Something that must not go on quietly: a failure of ackkit's own tasks, or a
        handler that raised an interpreter-exit signal. The app stops (its deliveries
        settled or left to the broker to requeue), `run()` raises `exc`, `is_running`
        turns False; never a listener that looks alive and consumes nothing."""
        if self.fatal is None:
            self.fatal = exc
        if isinstance(exc, EXIT_SIGNALS):
            log.error("%s; stopping the app", what)
        else:
            log.error("%s: %s; stopping the app", what, short(exc), exc_info=exc)
        if self._stop_task is None:
            self._stop_task = self.loop.create_task(self._stop(None))

    async def pause(self, delay: float) -> bool:
        """Sleep `delay` seconds; True (at once) when a shutdown was requested."""
        if self.stopping:
            return True
        try:
            await asyncio.wait_for(self._stop_requested.wait(), delay)
        except TimeoutError:
            return self.stopping
        return True

    # -- lifecycle -----------------------------------------------------------------

    async def start(self) -> None:
        self._main = self.loop.create_task(self._run_forever(), name="ackkit-async-main")
        self._ticker = self.loop.create_task(self._tick_forever(), name="ackkit-async-tick")
        ready = self.loop.create_task(self.ready.wait())
        try:
            await asyncio.wait(
                {ready, self._main},
                timeout=self.app.startup_timeout,
                return_when=asyncio.FIRST_COMPLETED,
            )
        finally:
            ready.cancel()
        if self.fatal is not None or not self.ready.is_set():
            fatal = self.fatal
            await self.stop(0)
            if fatal is not None:
                raise fatal
            raise ConnectFailed(
                f"no connection to {self.app.safe_url} within {self.app.startup_timeout} s"
            )

    async def _run_forever(self) -> None:
        try:
            while not self.stopping:
                retrying = AsyncRetrying(
                    wait=reconnect_wait(self.app.reconnect_max_interval),
                    retry=retry_if_exception_type(ConnectFailed),
                    reraise=True,
                    before_sleep=reconnect_logger(self.app.safe_url),
                )
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
        """One connection's life. Raises ConnectFailed if it never served."""
        app = self.app
        conn, amqp = await open_connection(
            app.url, heartbeat=app.heartbeat, name=app.connection_name, timeout=10.0, tls=app.tls
        )
        self.connection, self.amqp, self.numbers = conn, amqp, ChannelNumbers()
        try:
            try:
                own = [q for c in self.consumers for q in c.core.topology()]
                user = [
                    (c.spec.queue, c.spec.queue_arguments) for c in self.consumers if c.spec.declare
                ]
                existing = [c.spec.queue for c in self.consumers if not c.spec.declare]
                await declare_queues(amqp, self.numbers, own, user, existing)
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
            self.publisher.channel = None
        if not self.stopping:
            reason = "" if amqp.closing.cancelled() else repr(amqp.closing.exception())
            log.warning(
                "ackkit: connection to %s lost (%s); reconnecting",
                app.safe_url,
                mask_text(reason),
            )

    async def _tick_forever(self) -> None:
        while True:
            await asyncio.sleep(TICK)
            for c in self.consumers:
                try:
                    await c.tick()
                except Exception:  # pragma: no cover - keep flushing the other listeners
                    log.exception("%s: flushing acks failed", c.spec.name)

    async def stop(self, timeout: float | None = None) -> None:
        """Graceful: cancel consumers, finish handlers, return unstarted, flush acks, close.

        Concurrent calls share one shutdown."""
        if self._stop_task is None:
            self._stop_task = self.loop.create_task(self._stop(timeout))
        await asyncio.shield(self._stop_task)

    async def _stop(self, timeout: float | None) -> None:
        timeout = self.app.shutdown_timeout if timeout is None else timeout
        self.stopping = True
        self._stop_requested.set()
        amqp = self.amqp
        serving = self._serving and amqp is not None and not amqp.is_closed
        if serving:
            for c in self.consumers:
                await c.cancel()
            await asyncio.sleep(0)  # callbacks of deliveries that arrived before CancelOk
            for c in self.consumers:
                await c.release_unstarted()
            await self._finish_handlers(timeout)
            for c in self.consumers:
                await c.release_unstarted()
                await c.drain()
            await self.publisher.wait(CONFIRM_TIMEOUT)
            for c in self.consumers:
                await c.drain()
        else:
            await self._finish_handlers(0)
        for task in (self._ticker, *self._background):
            if task is not None:
                task.cancel()
        conn = self.connection
        if conn is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(conn.close(), 10.0)
        if self._main is not None and not self._main.done():
            self._main.cancel()
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(self._main, 10.0)
        for c in self.consumers:
            if c.pool is not None:
                c.pool.shutdown(wait=False, cancel_futures=True)

    async def _finish_handlers(self, timeout: float) -> None:
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
                    timeout,
                )
        for t in late:
            t.cancel()
        await asyncio.wait(late, timeout=CANCEL_TIMEOUT)
