"""The App's consumer: one listener on one pika channel, its handler worker threads.

pika is not thread-safe, so every channel call happens on the I/O thread.
Workers run handlers and report outcomes to the listener's core under its
lock; whatever actions come back wait in the executor's outbox for the I/O
thread, tagged with the channel generation they belong to (`Executor`).
"""

from __future__ import annotations

import logging
import queue as _queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from .._app.invocation import Invocation
from .._app.spec import Instrument, ListenerSpec, probe_for
from .._connection.salvage import describe
from .._core.actions import Republish, TxSelect
from .._core.events import Observer
from .._core.listener import ListenerCore
from .._core.policy import AckMode
from .._core.step import Step
from .._interpreter import attempts as A
from .._messages.delivery import Delivery, DeliveryBase
from .._messages.publish import Outgoing
from .._telemetry.logs import FailureLog
from . import _frames as frames
from . import flowing, refusals
from ._pika import quiet_refusals
from .executor import Executor
from .handoff import Handoff
from .host import Host as Host
from .publisher import Publisher

if TYPE_CHECKING:
    from ..inbox._sync import SyncInbox

log = logging.getLogger("ackkit")


class Consumer(Executor):
    """One listener on one channel (re-opened as a new generation after a loss)."""

    def __init__(
        self,
        rt: Host[Consumer],
        spec: ListenerSpec,
        observer: Observer | None,
        instruments: Sequence[Instrument] = (),
    ) -> None:
        core = spec.consumer_core(observer)
        super().__init__(spec.name, core, rt, log)
        self.rt = rt
        self.spec = spec
        # unstarted deliveries; with one handler thread, handed over a socket read at a time
        self.inbox: Handoff[Delivery] = Handoff(self.lock, per_burst=spec.concurrency == 1)
        self.consumer_tag: str | None = None
        self.workers: list[threading.Thread] = []
        self.in_handler = 0
        self.cancelled = threading.Event()
        self.binding = spec.binding
        self.queue_name = spec.queue
        self.no_ack = spec.policy.mode is AckMode.NONE
        self.failures = FailureLog(log)
        self.probe = probe_for(instruments, spec, self.core)  # metrics, tracing: None when off
        # what a refused or cancelled consumer comes to (the core's `Consuming`)
        self.consuming = spec.consuming(self.core)
        self.awaiting_ok = False  # a basic.consume the broker has not answered yet
        self.tx: SyncInbox | None = None  # inbox=: the handler runs in its transaction
        if spec.inbox is not None:
            from ..inbox._sync import SyncInbox

            self.tx = SyncInbox(spec.inbox, InboxHost(self))
        # this listener's own confirm channel for its copies: another listener's refused
        # copy, or a handler's publish to a missing exchange, never closes it
        self.copies = Publisher(rt)

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
        ch.add_on_cancel_callback(lambda frame: refusals.cancelled_by_broker(self, ch, frame))
        with self.lock:
            acts = self.core.channel_opened()
        for a in acts:
            if isinstance(a, TxSelect):
                ch.tx_select()
        prefetch = self.spec.policy.prefetch
        ch.basic_qos(prefetch_count=prefetch, callback=lambda _f: self._consume(ch))

    def _consume(self, ch: Any) -> None:
        self.cancelled.clear()
        self.consumer_tag = None
        if self.core.gating.consuming:  # not while paused or tripped
            self._basic_consume(ch)  # ready once the broker answered (`_on_consume_ok`)
        else:
            self.rt.consumer_ready(self)

    def _basic_consume(self, ch: Any) -> None:
        spec = self.spec
        self.awaiting_ok = True
        quiet_refusals(ch, True)  # a refusal is logged once, by `refusals`, not by pika
        self.consumer_tag = ch.basic_consume(
            spec.queue,
            self._on_message,
            auto_ack=self.no_ack,
            exclusive=spec.exclusive,
            arguments=spec.consumer_arguments or None,
            callback=lambda _frame: self._on_consume_ok(ch),
        )

    def _on_consume_ok(self, ch: Any) -> None:
        self.awaiting_ok = False
        quiet_refusals(ch, False)
        if ch is not self.channel:
            return
        line = self.consuming.consumed()
        if line:
            log.info("%s", line)
        self.rt.consumer_ready(self)

    def _on_channel_closed(self, ch: Any, reason: BaseException) -> None:
        if ch is not self.channel:
            return
        refused, self.awaiting_ok = self.awaiting_ok, False
        self.inbox.hand_over()  # a burst whose hand-over this channel's loop may not run
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
        conn = self.rt.connection
        live = not self.rt.stopping and conn is not None and conn.is_open
        if refused and live and code not in (0, 200, 320):
            refusals.refused(self, conn, code, getattr(reason, "reply_text", str(reason)))
            return
        if code not in (0, 200, 320):
            log.error("%s: channel closed by broker: %s", self.spec.name, reason)
        if live:
            conn.ioloop.call_later(1.0, lambda: self._reopen(conn))

    def _on_message(self, ch: Any, method: Any, props: Any, body: bytes) -> None:
        exchange, rk = method.exchange, method.routing_key
        why: str | None = None
        if type(exchange) is not str or type(rk) is not str:  # pika left bytes (not UTF-8)
            why = frames.unreadable(method, props)
            exchange, rk = frames.text(exchange), frames.text(rk)
        elif getattr(props, "ackkit_unreadable", None) is not None:
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
                    wire_headers=getattr(props, "wire_headers", None),
                    properties=None if why else props,
                    count=getattr(method, "delivery_count", None),  # AMQP 1.0's own count
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
            queue=self.queue_name,
            decoder=self.binding.decoder,
        )
        with self.lock:
            self.originals.put(t.generation, t.tag, d)
            if t.verdict is None:
                self.inbox.arrive(d, self._later)
                return
            if t.verdict:
                self.queue(Step(t.generation, t.verdict))
                if self.no_ack:  # the broker settled it on send: its copy has its original
                    self.originals.drop(t.generation, t.tag)
        if t.verdict:  # decided (or, empty, held: by the flow gate too)
            self.flush()

    def _later(self, fn: Callable[[], None]) -> None:
        """I/O thread: run `fn` once the current socket read is dealt with."""
        conn = self.rt.connection
        if conn is not None:
            conn.ioloop.call_later(0, fn)
        else:  # never expected while a delivery arrives: hand over at once
            fn()

    def _start(self, held: Delivery) -> None:
        """A delivery the core held starts (`Start`): through the flow gate."""
        with self.lock:
            t = held._tracked
            acts = self.core.gating.admit(t)
            if acts:
                self.send(Step(t.generation, acts))
        if acts is None:
            self.inbox.put(held)

    def _run_ready(self, d: Delivery) -> None:
        self.inbox.put(d)

    def _switch_consumer(self, on: bool) -> None:
        flowing.switch(self, on)

    def tick(self) -> None:
        if self.channel is not None:
            self.decide(self.core.tick)

    def _publish(self, gen: int, a: Republish) -> None:
        self.copies.publish(self, gen, a)

    # -- worker threads --------------------------------------------------------

    def _settle(self, delivery: DeliveryBase, kind: str, requeue: bool, multiple: bool) -> None:
        """Delivery.ack()/nack()/reject() from a handler (Settler protocol)."""
        with self.lock:
            acts = self.core.settle(delivery._tracked, kind, requeue=requeue, multiple=multiple)
            if acts.actions:
                self.send(acts)

    def start_workers(self) -> None:
        if self.tx is not None:
            self.tx.start()
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
        take = self.inbox.take
        run = self._run_no_ack if self.no_ack else self._run
        while True:
            d = take()
            if d is None:
                return
            run([d])

    def _take_batches(self) -> None:
        size = self.spec.batch_size or 1
        timeout = self.spec.batch_timeout
        while True:
            first = self.inbox.take()
            if first is None:
                return
            batch = [first]
            deadline = time.monotonic() + timeout
            while len(batch) < size:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                try:
                    nxt = self.inbox.take(timeout=left)
                except _queue.Empty:
                    break
                if nxt is None:
                    self.inbox.leave_again()
                    break
                batch.append(nxt)
            (self._run_no_ack if self.no_ack else self._run)(batch)

    def _run_no_ack(self, ds: list[Delivery]) -> None:
        """`_run`, for deliveries the broker settled on send: no settle frame ends them,
        so the executor is done with them here."""
        try:
            self._run(ds)
        finally:
            with self.lock:
                for d in ds:
                    self.originals.drop(d._tracked.generation, d._tracked.tag)

    def _run(self, ds: list[Delivery]) -> None:
        """Run the handler for `ds` (one delivery, or a batch) until the core is done with
        it: the interpreter's attempt loop, driven on this worker thread. The core is
        asked under the listener's lock, and what it decides is queued for the I/O thread
        before the lock is let go (decision order is frame order)."""
        core = self.core
        loop = A.attempts(core, self.binding, ds, inbox=self.tx is not None, probe=self.probe)
        lock = self.lock
        answer: Any = None
        req: Any
        while True:
            try:
                req = loop.send(answer)
            except StopIteration:
                return
            answer = None
            kind = type(req)
            if kind is A.Ask:
                with lock:
                    answer = req.fn(*req.args)
                    if answer.actions:  # a Step with actions
                        self.send(answer)
            elif kind is A.Call:
                answer = self._call(req.inv)
            elif kind is A.Pause:
                self.rt.stop_event.wait(req.seconds)
            elif kind is A.Failed:
                self.failures.failed(self.spec.name, req.inv, req.exc)
            elif kind is A.Stop:
                exc = req.exc
                self.rt.fail(exc, f"{self.spec.name}: handler raised {type(exc).__name__}")
            elif kind is A.LookUp:
                assert self.tx is not None
                answer = self.tx.look_up(req.delivery)
            elif kind is A.Down:
                assert self.tx is not None
                self.tx.down(req.inv, req.exc)

    def _call(self, inv: Invocation) -> A.Called:
        """Call the handler once (in the inbox's transaction, with one)."""
        self.in_handler += 1
        try:
            if not inv.deliveries:
                return A.RETURNED
            tx = self.tx
            result = self.binding.fn(*inv.args()) if tx is None else tx.call(inv)
        except BaseException as e:  # SystemExit and KeyboardInterrupt too: settled, then stop
            return A.Called(exc=e)  # the core formats the traceback if it dead-letters
        finally:
            self.in_handler -= 1
        return A.RETURNED if result is None else A.Called(result)

    def publish_message(self, msg: Outgoing) -> None:
        """`Delivery.publish()` / `reply()` from a handler: confirmed, on the app's publisher
        (an inbox listener's: written to its outbox, in the handler's transaction)."""
        if self.tx is not None and self.tx.enqueue(msg):
            return
        self.rt.publish(msg)


class InboxHost:
    """The consumer as its inbox sees it (`ackkit.inbox._host.SyncHost`)."""

    __slots__ = ("c", "name")

    def __init__(self, c: Consumer) -> None:
        self.c = c
        self.name = c.spec.name

    def decide(self, fn: Callable[[ListenerCore], Step | None]) -> None:
        c = self.c
        with c.lock:
            step = fn(c.core)
            if step:
                c.send(step)  # in decision order; the I/O thread sends

    def wait(self, seconds: float) -> bool:
        return self.c.rt.stop_event.wait(seconds)

    def publish(self, msg: Outgoing) -> None:
        self.c.rt.publish(msg)
