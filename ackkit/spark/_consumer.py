"""The runner-side consumer: an I/O thread that owns the broker connection.

It lives in Spark's `python_streaming_source_runner` process for the whole
query, so delivery tags stay valid across micro-batches. pika is not
thread-safe: every channel call happens on the I/O thread; the reader's
thread (Spark asks it for batches) and the IPC thread (the foreachBatch
wrapper says "written") hand it actions through the executor's outbox
(`ackkit._sync.executor`), tagged with the channel generation they belong to.
The connection's life is the shared pika `Engine`, the consuming channel's is
`SourceChannel` (spark/_channel.py), the copies (dead letters)
go through the shared confirm `Publisher`. Every decision (what a batch
holds, which tags may be acked, what a poison message becomes) is the core's:
`ListenerCore` and `BatchLedger`; this module only carries them out. What a
delivery's bytes become in a row (key, decoded payload, metadata) is `_rows`.
"""

from __future__ import annotations

import collections
import itertools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import pika
import pika.exceptions
from pydantic import BaseModel

from .._connection.io import FatalConnectError
from .._connection.url import mask_url
from .._core.actions import Ack, Action, Republish
from .._core.brokers import traits_of
from .._core.errors import AckkitError, TopologyConflict
from .._core.listener import ListenerCore
from .._core.policy import NO_RETRY, AckMode, ListenerPolicy
from .._core.step import Step
from .._sync import _frames as frames
from .._sync._pika import declare_queues, parameters
from .._sync.engine import Engine
from .._sync.executor import Executor
from .._sync.publisher import Publisher
from . import _rows as rows
from ._channel import SourceChannel
from ._core.admission import Limits, admit
from ._core.batches import Admission, BatchLedger, BatchPlan
from ._options import OnInvalid, SourceOptions
from ._rows import Item

log = logging.getLogger("ackkit.spark")


class SourceFailed(AckkitError):
    """The source cannot go on (authentication, topology, or a poison message with
    on_invalid=fail); the query fails with this error."""


class SourceConsumer(SourceChannel, Engine, Executor):
    """Consumes one queue with manual acks and a prefetch window for one streaming source:
    the engine of its connection and the executor of its one listener (the life of its
    consuming channel: `SourceChannel`)."""

    tick_interval = 0.1

    def __init__(
        self,
        opts: SourceOptions,
        model: type[BaseModel] | None,
        *,
        written_upto: int = 0,
    ) -> None:
        self.opts = opts
        self.model = model
        self.limits = Limits(opts.max_batch, opts.max_bytes)
        policy = ListenerPolicy(
            name=f"spark:{opts.queue}",
            queue=opts.queue,
            mode=AckMode.AUTO,
            prefetch=opts.prefetch,
            retry=NO_RETRY,
            dead_letter=opts.dead_letter_queue,
            # Batches are acked when written (one multiple-ack); only dead-letter
            # acks are left for the periodic flush.
            flush=BatchLedger.flush_policy(opts.prefetch),
        )
        # several node addresses: each connection after a failed or lost one uses the next
        Engine.__init__(self, opts.url, mask_url(opts.url), max_interval=5.0, urls=opts.urls)
        Executor.__init__(self, policy.name, ListenerCore(policy), self, log)
        self.ledger = BatchLedger(self.core, written_upto=written_upto, on_invalid=opts.on_invalid)
        self.cond = threading.Condition(self.lock)
        self.buffer: collections.deque[Item] = collections.deque()
        self.publisher = Publisher(self)
        self._consumer_tag: str | None = None
        self._waiting = 0
        self._ready = threading.Event()
        self._refused_since: float | None = None
        self.waiting_for: str | None = None  # "exclusive": another consumer holds the queue
        self.connections = 0
        self.received = 0
        self.invalid = 0
        self.copies = 0

    # -- lifecycle (reader thread) ---------------------------------------------------

    def start(self) -> None:
        """Start the I/O thread; it connects (and reconnects) on its own. Never blocks: a
        restarted query must be able to ack its replayed batch while the broker is slow."""
        self.start_io("ackkit-spark-io")

    def wait_ready(self, timeout: float) -> bool:
        """Wait until consuming (for tests and diagnostics); raises a fatal error."""
        deadline = time.monotonic() + timeout
        while not self._ready.wait(0.05):
            self._raise_fatal()
            if time.monotonic() > deadline:
                return False
        return True

    def stop(self, timeout: float = 5.0) -> None:
        """Flush settled acks and close the connection (the broker requeues the rest)."""
        if self.stopping:
            return
        self.request_stop()
        with self.cond:
            self.cond.notify_all()
        self.call_soon(self._close)
        if self._thread is not None:
            self._thread.join(timeout)

    # -- batches (reader thread) ------------------------------------------------------

    def take(self, start: int, seal: Callable[[list[Item], BatchPlan], None]) -> BatchPlan:
        """Wait for deliveries, then form batch (start, ...] from up to max_batch of them.

        `seal(rows, plan)` builds the batch from its rows (the runner makes it durable in
        the write-ahead log once this returns, before Spark hears of it). It runs under the
        consumer's lock, so the I/O thread pauses at its next delivery: Spark waits for
        this CPU-bound step, and it should not share the GIL with a thread parsing frames."""
        o = self.opts
        with self.cond:
            deadline = time.monotonic() + o.max_wait
            self._waiting += 1
            try:
                while not self.buffer:
                    self._raise_fatal()
                    left = deadline - time.monotonic()
                    if left <= 0 or self.stopping:
                        return BatchPlan(start, start, [], [])
                    self.cond.wait(left)
                # Messages flow: keep filling while they do, up to the caps.
                cap = time.monotonic() + max(o.max_wait, 5 * o.linger)
                while self._admit() == len(self.buffer) < o.max_batch and time.monotonic() < cap:
                    n = len(self.buffer)
                    self.cond.wait(o.linger)
                    if len(self.buffer) == n:
                        break
            finally:
                self._waiting -= 1
            self._raise_fatal()
            return self._hand_out(start, self._admit(), seal)

    def _admit(self, waiting: int | None = None) -> int:
        """How many of the first `waiting` buffered deliveries (all by default) the next
        batch takes (the core's `admit`: maxMessagesPerTrigger, maxBytesPerTrigger)."""
        n = len(self.buffer) if waiting is None else waiting
        if self.limits.max_bytes is None:
            return min(n, self.limits.max_messages)
        return admit((len(it.meta.body) for it in itertools.islice(self.buffer, n)), self.limits)

    def _hand_out(
        self, start: int, n: int, seal: Callable[[list[Item], BatchPlan], None]
    ) -> BatchPlan:
        """Form batch (start, ...] from the first `n` buffered deliveries (under the lock)."""
        o = self.opts
        items = [self.buffer.popleft() for _ in range(n)]
        for it in items:
            if it.error is not None:
                raise SourceFailed(it.invalid(o.queue))
        plan = self.ledger.plan(start, [(it.tracked, it.key) for it in items])
        if len(plan.rows) < len(items):  # some were copies (or stale): count them
            self.copies += sum(a in (Admission.HELD, Admission.SETTLED) for a in plan.admissions)
        if plan.rows:
            seal([items[i] for i in plan.rows], plan)
        if plan.actions:
            self.send(Step(self.core.generation, plan.actions))
        return plan

    def _raise_fatal(self) -> None:
        if self.fatal is not None:
            raise self.fatal

    def restore(self, end: int, keys: list[str | None]) -> None:
        with self.lock:
            self.ledger.restore(end, keys)

    def forget(self, upto: int) -> int:
        with self.lock:
            return self.ledger.forget(upto)

    # -- written (IPC thread, or the reader's commit) -----------------------------

    def written(self, end: int, timeout: float = 30.0) -> dict[str, int]:
        """Ack every delivery of batches up to `end` (and their held copies).

        Returns once the I/O thread has written the ack frames to the socket (not after a
        broker round trip, which would wait behind the deliveries the ack lets in: a frame
        lost with the connection means a redelivery, and the ledger acks a redelivered copy
        of a written batch at once)."""
        with self.lock:
            w = self.ledger.written(end)
            if w.actions:
                self.queue(Step(self.core.generation, w.actions))
        sent = self.flushed(timeout) if w.actions else True
        return {
            "acked": w.acked,
            "held": w.held,
            "stale": w.stale,
            "frames": sum(1 for a in w.actions if isinstance(a, Ack)),
            "sent": int(sent),
        }

    def stats(self) -> dict[str, int]:
        with self.lock:
            counts = self.core.counters.snapshot()
            gauges = self.core.gauges()
            return {
                "received": self.received,
                "buffered": len(self.buffer),
                "unwritten": self.ledger.unwritten,
                "holding": self.ledger.holding,
                "remembered": self.ledger.remembered,
                "written_upto": self.ledger.written_upto,
                "dead_lettered": counts["dead_lettered"],
                "invalid": self.invalid,
                "connections": self.connections,
                "ack_frames": counts["ack_frames"],
                "pending_acks": gauges.pending_acks,
                "copies": self.copies,
                "republishing": gauges.republishing,
                "waiting_exclusive": int(self.waiting_for == "exclusive"),
            }

    # -- the engine's hooks (I/O thread) ----------------------------------------------

    def parameters(self) -> Any:
        o = self.opts
        # the engine's url: the rotation's current node address
        return parameters(self.url, heartbeat=o.heartbeat, name=f"ackkit-spark:{o.queue}")

    def declare(self, conn: pika.BlockingConnection) -> None:
        with self.lock:
            self.core.use_broker(traits_of(conn._impl.server_properties))
        try:
            user: list[tuple[str, dict[str, Any]]] = (
                [(self.opts.queue, {})] if self.opts.declare else []
            )
            # With on_invalid=fail the dead-letter queue is declared on its first use
            # (the core also dead-letters a delivery with a forged attempt header): the
            # copy comes back unroutable and the core asks for the queue to be declared.
            own = (
                self.core.queues.topology() if self.opts.on_invalid is OnInvalid.DEAD_LETTER else []
            )
            declare_queues(conn, own, user)
            if not self.opts.declare:
                ch = conn.channel()
                try:
                    ch.queue_declare(self.opts.queue, passive=True)
                except pika.exceptions.ChannelClosedByBroker as exc:
                    raise SourceFailed(
                        f"queue {self.opts.queue!r} does not exist: {exc.reply_text}"
                    ) from None
        except TopologyConflict as exc:
            raise SourceFailed(str(exc)) from None

    def opened(self, conn: Any) -> None:
        self.connections += 1
        conn.channel(on_open_callback=self._on_channel_open)
        self.publisher.open(conn)

    def flushed(self, timeout: float) -> bool:
        """Have the I/O thread carry out the queued actions; True once it has (the frames
        are written to the socket), False when it is gone or `timeout` passed."""
        done = threading.Event()

        def run() -> None:
            try:
                self.flush()
            finally:
                done.set()

        return self.call_soon(run) and done.wait(timeout)

    def channels_lost(self, reason: BaseException) -> None:
        if self.channel is not None:
            self._on_channel_closed(self.channel, reason)

    def closed(self, reason: BaseException) -> None:
        self.channels_lost(reason)
        if self.publisher.channel is not None:
            self.publisher._on_closed(self.publisher.channel, reason)

    def tick(self) -> None:
        if self.channel is not None:
            self.decide(self.core.tick)

    def retryable(self, exc: BaseException) -> bool:
        # Anything but a refusal is tried again: the query outlives a broker's bad day.
        fatal = (SourceFailed, FatalConnectError, TopologyConflict)
        return isinstance(exc, Exception) and not isinstance(exc, fatal)

    def refused(self, exc: FatalConnectError | TopologyConflict) -> None:
        self.fatal = SourceFailed(str(exc))

    def finished(self) -> None:
        with self.cond:
            self.cond.notify_all()

    def fail_query(self, why: str) -> None:
        """The source cannot go on: the reader's next call raises SourceFailed(why)."""
        self.fatal = SourceFailed(why)
        self.finished()

    # -- deliveries (I/O thread; the channel's life is `SourceChannel`) ------------------

    def _on_message(self, ch: Any, method: Any, props: Any, body: bytes) -> None:
        if ch is not self.channel:
            return
        o = self.opts
        mid = props.message_id
        key = rows.key_of(o.key, mid, body)
        parsed, error = rows.decode(self.model, body)
        why = frames.unreadable(method, props)  # dead-lettered by the core's verdict
        hdrs = None if why else props.headers
        exchange, rk = frames.text(method.exchange), frames.text(method.routing_key)
        with self.lock:
            t = self.core.receive(
                method.delivery_tag,
                method.redelivered,
                hdrs,
                exchange,
                rk,
                mid,
                unreadable=why,
                wire_headers=getattr(props, "wire_headers", None),
            )
            self.received += 1
            acts: Sequence[Action] | None = t.verdict
            if acts is None and error is not None:
                self.invalid += 1
                acts = self.ledger.invalid(t, error)
            if acts is None:
                meta = rows.row_meta(method, props, body, hdrs, t.attempt, exchange, rk)
                self.buffer.append(Item(t, key, meta, parsed, error))
                if self._waiting and (
                    len(self.buffer) == 1 or len(self.buffer) >= o.max_batch or error
                ):
                    self.cond.notify_all()
            else:
                # Decided on arrival (dead-lettered: unreadable, forged, invalid, looping):
                # its original is kept for the copy (`queue` remembers it under the copy's
                # token). A row of a batch is only ever acked: not kept (less work per
                # delivery on the I/O thread).
                self.originals.put(t.generation, t.tag, (props, body))
                if acts:
                    self.queue(Step(t.generation, list(acts)))
        if acts:  # (actions queued by other threads come with a call_soon(flush) of their own)
            self.flush()

    def _close(self) -> None:
        conn = self.connection
        if conn is None or not conn.is_open:
            return
        self.decide(self.core.drain)
        conn.close()

    # -- the executor's hooks ------------------------------------------------------------

    def _publish(self, gen: int, a: Republish) -> None:
        self.publisher.publish(self, gen, a)

    def original(self, a: Republish) -> tuple[Any, bytes]:
        original = self.originals.copy(a.token)  # remembered when the copy was decided
        if original is None:  # never expected: a copy is decided while its delivery is mapped
            raise LookupError(f"the original of copy {a.token} is not remembered")
        props, body = original
        return props, body
