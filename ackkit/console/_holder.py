"""The console's hold on the dead-letter queues: consume unacked, index, settle on request.

AMQP 0-9-1 cannot browse a queue, so the console takes the dead letters as a
consumer with manual acknowledgement and keeps them unacked while it runs
(`Store` indexes them). The broker still counts every one of them (as
unacknowledged), and gives them all back to the queue, in order, when the
console's connection closes: a stop, a crash or a lost connection loses nothing
and leaves the counts right. Actions settle one held delivery each:

- replay: publish a copy (publisher confirm, mandatory) to the source queue or
  another queue, and ack the dead letter only once the broker confirmed the copy
  (the DLQ tool's rule, as `ackkit dlq replay` does it, a window of copies at a time);
- delete: ack.

Given several node addresses (a cluster), the holder connects to the first that
answers and, after a lost connection, to the next one in turn.

The hold is bounded: at most `max_held` per DLQ, on channels whose prefetch is
at most SLOT_MAX each (prefetch is a 16-bit count). Everything pika does runs
on the holder's own thread; the web pages submit work and wait for a Future.
"""

from __future__ import annotations

import contextlib
import copy
import datetime as _dt
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TypeVar

import pika.exceptions

from .._connection import addresses
from .._connection.io import connect_in_turn
from .._connection.url import mask_text, mask_url
from .._core import checks as C
from .._sync import _frames as frames
from .._sync._pika import blocking_connection, copy_properties, parameters
from ..dead_letters._letter import describe, replay_headers, replay_target
from ._confirms import WINDOW, ConfirmedPublisher, Copy
from ._groups import group_key
from ._store import Entry, Store

log = logging.getLogger("ackkit.console")

CHECKED = 100
"""Target queues a dry run asks the broker about (a passive declare each)."""
SLOT_MAX = 50_000
"""Prefetch of one holding channel (basic.qos takes at most 65,535)."""
T = TypeVar("T")


def _now() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="milliseconds")


@dataclass
class ActionResult:
    """What one replay or delete did."""

    action: str
    requested: int = 0
    done: int = 0
    taken: int = 0
    """Asked for, but already claimed by another action (or settled meanwhile)."""
    failed: int = 0
    no_target: int = 0
    gone: int = 0
    """Its channel had closed (the broker requeued it; it comes back to the console)."""
    targets: dict[str, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)

    def summary(self) -> str:
        where = ", ".join(f"{n} to {t}" for t, n in self.targets.items())
        out = f"{self.action}: {self.done} of {self.requested}"
        if where:
            out += f" ({where})"
        for n, what in (
            (self.taken, "already taken by another action"),
            (self.failed, "failed, left in the DLQ"),
            (self.no_target, "without a source queue, left in the DLQ"),
            (self.gone, "returned to the queue by the broker"),
        ):
            if n:
                out += f"; {n} {what}"
        return out


@dataclass(frozen=True, slots=True)
class Counts:
    """One DLQ's numbers as the overview shows them, adding up to `in_queue`."""

    held: int
    """Held and indexed by this console."""
    on_the_way: int
    """Delivered or being delivered to the console, not indexed yet: the broker's count
    when the console connected, less what is indexed, settled since, or still ready."""
    ready: int | None
    """Ready in the queue (beyond --max-held), the broker's count (None: not asked yet)."""
    at_connect: int | None
    """The broker's count of the queue when the console connected (None: not yet)."""
    indexing: bool
    """The console is still receiving what was in the queue when it connected."""

    @property
    def in_queue(self) -> int:
        return self.held + self.on_the_way + (self.ready or 0)


QUIET = 10.0
"""Seconds without a delivery after which indexing is over even if the broker's count
at connect was not reached (others consumed some, some expired)."""


@dataclass
class DryRun:
    """What a replay would do, found without changing anything."""

    requested: int = 0
    targets: dict[str, int] = field(default_factory=dict)
    """Target queue -> dead letters whose copy would go there."""
    missing: list[str] = field(default_factory=list)
    """Targets the broker has no queue of: those copies would come back, their dead
    letters would stay."""
    no_target: int = 0
    """Without a source queue (and no queue named): would stay in the DLQ."""
    not_held: int = 0
    """Replayed, deleted or being settled by another action meanwhile."""
    unchecked: list[str] = field(default_factory=list)
    """Targets past the first CHECKED: not asked whether they exist."""

    @property
    def would_replay(self) -> int:
        """Copies that would be published and confirmed (their queue exists)."""
        return sum(c for t, c in self.targets.items() if t not in self.missing)

    def summary(self) -> str:
        out = f"dry run: {self.would_replay} of {self.requested} would be replayed"
        gone = " (no such queue: they would stay in the DLQ)"
        where = ", ".join(
            f"{c} to {t}{gone if t in self.missing else ''}" for t, c in self.targets.items()
        )
        if where:
            out += f" ({where})"
        for c, what in (
            (self.no_target, "without a source queue, would stay in the DLQ"),
            (self.not_held, "no longer held (settled or being settled)"),
        ):
            if c:
                out += f"; {c} {what}"
        return out + "; nothing was changed"


@dataclass
class _Slot:
    ch: Any
    generation: int
    prefetch: int
    cancelled: bool = False


class Holder:
    """Holds the dead letters of `dlqs` unacked and settles them on request."""

    def __init__(
        self,
        url: str | Sequence[str],
        dlqs: Iterable[str],
        store: Store,
        *,
        max_held: int = 100_000,
        name: str = "ackkit-console",
    ) -> None:
        self.urls = addresses.parse(url)
        """Every node's URL (one URL, the comma form or a list), in the order tried."""
        self._rotation = addresses.Rotation(self.urls)
        self.url = self.urls[0]
        """The node address of the current (or the next) connection."""
        self.dlqs = [C.queue_name("dlq", q, declared=False) for q in dlqs]
        if not self.dlqs:
            raise ValueError("the console needs at least one dead-letter queue")
        self.max_held = C.integer("max_held", max_held, 1)
        self.store = store
        self.name = name
        self.ready_counts: dict[str, int | None] = dict.fromkeys(self.dlqs)
        """Messages ready (not held by anyone) in each DLQ, from the broker."""
        self.at_connect: dict[str, int | None] = dict.fromkeys(self.dlqs)
        """Messages ready in each DLQ when the console connected (before it consumed)."""
        self._settled: dict[str, int] = dict.fromkeys(self.dlqs, 0)
        self._last_delivery: dict[str, float] = dict.fromkeys(self.dlqs, 0.0)
        self._indexed: set[str] = set()
        self._conn: Any = None
        self._publisher: ConfirmedPublisher | None = None
        self._slots: dict[str, list[_Slot]] = {}
        self._work: queue.Queue[tuple[Callable[[], Any], Future[Any]]] = queue.Queue()
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None
        self.failure: BaseException | None = None
        self._connected = False
        self._phase = ""

    # -- life -----------------------------------------------------------------------------

    def start(
        self,
        timeout: float | None = 60.0,
        *,
        progress: Callable[[str], None] | None = None,
        every: float = 5.0,
    ) -> None:
        """Connect, check the DLQs exist, start holding; raises what went wrong.

        While it waits, `progress` gets what it is waiting for every `every` seconds
        (`waiting_for()`). After `timeout` seconds (None: no limit) it stops and raises
        TimeoutError saying how far it got: a connection that was made is never reported
        as one that could not be (under load the broker can take minutes to answer
        basic.consume on a DLQ it is still requeueing into)."""
        self._thread = threading.Thread(target=self._run, name="ackkit-console-holder", daemon=True)
        self._thread.start()
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if deadline is None else deadline - time.monotonic()
            if self._ready.wait(every if left is None else max(0.0, min(every, left))):
                break
            if deadline is not None and time.monotonic() >= deadline:
                what = self.waiting_for()
                self.stop()
                raise TimeoutError(f"the console was not ready within {timeout:g} s: {what}")
            if progress is not None:
                progress(self.waiting_for())
        if self.failure is not None:
            self.stop()
            raise self.failure

    @property
    def safe_url(self) -> str:
        """Every node address, passwords masked (for the pages)."""
        return addresses.describe(self.urls)

    def waiting_for(self) -> str:
        """What starting is waiting for, in words (the broker URL's password masked)."""
        if not self._connected:
            return f"connecting to {self.safe_url} (waiting for the broker)"
        return f"connected to {mask_url(self.url)} ({self._phase})"

    def stop(self, timeout: float = 600.0) -> None:
        """Close the connection: the broker returns every held dead letter to its queue.

        Waits for the broker to answer the close (it requeues what was held first: with
        100,000 held on a busy node that takes a minute or more). A process that exits
        before would reset the connection, and acks the broker had not read yet would be
        dropped with it (their dead letters would come back beside their replayed copies)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def submit(self, fn: Callable[[], T]) -> Future[T]:
        """Run `fn` on the holder's thread (where pika lives)."""
        fut: Future[T] = Future()
        if self._stop.is_set():
            fut.set_exception(RuntimeError("the console is stopping"))
        else:
            self._work.put((fn, fut))
        return fut

    def counts(self, q: str) -> Counts:
        """What the console holds of `q` and what the broker counts, adding up."""
        held, ready, at = self.store.held(q), self.ready_counts.get(q), self.at_connect.get(q)
        if at is None:
            return Counts(held, 0, ready, None, True)
        settled = self._settled.get(q, 0)
        if q not in self._indexed and (
            held + settled >= min(at, self.max_held)
            or time.monotonic() - self._last_delivery.get(q, 0.0) > QUIET
        ):
            self._indexed.add(q)  # done for this connection: later arrivals are live
        indexing = q not in self._indexed
        way = max(0, at - held - settled - (ready or 0)) if indexing else 0
        return Counts(held, way, ready, at, indexing)

    # -- actions (called from any thread; the work runs on the holder's) ------------------

    def replay(self, ids: Iterable[int], to: str | None = None, who: str = "?") -> Future[Any]:
        if to is not None:
            C.queue_name("to", to, declared=False)
        wanted = list(ids)
        entries = self.store.claim(wanted)
        res = ActionResult("replay", len(wanted), taken=len(wanted) - len(entries))
        return self.submit(partial(self._settle, entries, res, to, who))

    def dry_run(self, ids: Iterable[int], to: str | None = None) -> Future[DryRun]:
        """What `replay(ids, to)` would do: where each copy would go, how many, and
        whether those queues exist (a passive declare each). Claims, publishes and acks
        nothing."""
        if to is not None:
            C.queue_name("to", to, declared=False)
        wanted = list(ids)
        plan = DryRun(len(wanted))
        for i in wanted:
            e = self.store.entry(i)
            if e is None or e.claimed:
                plan.not_held += 1
            elif (target := replay_target(e.dl, to)) is None:
                plan.no_target += 1
            else:
                plan.targets[target] = plan.targets.get(target, 0) + 1
        plan.targets = dict(sorted(plan.targets.items(), key=lambda kv: (-kv[1], kv[0])))
        return self.submit(partial(self._check_targets, plan))

    def _check_targets(self, plan: DryRun) -> DryRun:
        ch = None
        plan.unchecked = list(plan.targets)[CHECKED:]
        try:
            for t in list(plan.targets)[:CHECKED]:
                if ch is None or not ch.is_open:
                    ch = self._conn.channel()
                try:
                    ch.queue_declare(t, passive=True)
                except pika.exceptions.ChannelClosedByBroker:
                    plan.missing.append(t)
        finally:
            if ch is not None and ch.is_open:
                ch.close()
        return plan

    def delete(self, ids: Iterable[int], who: str = "?") -> Future[Any]:
        wanted = list(ids)
        entries = self.store.claim(wanted)
        res = ActionResult("delete", len(wanted), taken=len(wanted) - len(entries))
        return self.submit(partial(self._settle, entries, res, None, who))

    def _settle(self, entries: list[Entry], res: ActionResult, to: str | None, who: str) -> Any:
        try:
            for start in range(0, len(entries), WINDOW):
                batch = [e for e in entries[start : start + WINDOW] if self._holds(e, res)]
                if res.action == "delete":
                    for e in batch:
                        self._slots[e.dlq][e.slot].ch.basic_ack(e.method.delivery_tag)
                        self._done(e, res, None, who)
                else:
                    self._replay_window(batch, res, to, who)
            self._sync({(e.dlq, e.slot) for e in entries})
        except BaseException:
            self.store.release(entries)  # the connection is gone: its holds with it
            raise
        if res.action == "replay" and res.done:
            self.store.mark_replayed({e.key.id for e in entries})
        return res

    def _sync(self, slots: set[tuple[str, int]]) -> None:
        """A round trip through the queue, behind the acks, on each holding channel that
        acked: when the action reports done, the broker's count of the DLQ agrees, and a
        crash of the console after it returns cannot lose the acks (and bring back dead
        letters that were replayed).

        A round trip on the channel alone (basic.qos, as before) is not enough: the
        channel hands each ack on to the queue's own process, which takes it in later.
        The queue answers count queries (and a passive queue.declare) ahead of acks it
        has not taken in yet, but a basic.get only after them (RabbitMQ's queue process
        orders its mailbox by priority: ack 4, stat 7, info 9, basic.get 0); on a queue
        busy with 100,000 held the counts lagged by minutes. The basic.get finds nothing
        while the console holds everything; a dead letter it does get goes back at once
        (requeued: the console's consumer takes it again)."""
        for q, k in slots:
            slot = self._slots[q][k]
            if not slot.ch.is_open:
                continue
            method, _props, _body = slot.ch.basic_get(q, auto_ack=False)
            if method is not None:
                slot.ch.basic_reject(method.delivery_tag, requeue=True)

    def _holds(self, e: Entry, res: ActionResult) -> bool:
        """Whether the channel that delivered `e` is still the one holding it."""
        slot = self._slots[e.dlq][e.slot]
        if slot.generation == e.generation and slot.ch.is_open:
            return True
        res.gone += 1
        return False

    def _replay_window(
        self, batch: list[Entry], res: ActionResult, to: str | None, who: str
    ) -> None:
        """Copies published together and confirmed; each dead letter acked once its copy
        is confirmed and was not returned (the DLQ tool's rule, a window at a time)."""
        now = _now()
        sent: list[tuple[Entry, Copy]] = []
        for e in batch:
            target = replay_target(e.dl, to)
            if target is None:
                res.no_target += 1
                self.store.release([e])
                continue
            try:
                props = copy.copy(e.props)  # the held one keeps its headers for the pages
                props.headers = replay_headers(props.headers, now)
                props.wire_headers = None
                wire = copy_properties(props, {}, purpose="restamp")
            except Exception as exc:  # headers that cannot be encoded again, ...
                self._failed(e, res, target, mask_text(f"{type(exc).__name__}: {exc}")[:300])
                continue
            sent.append((e, Copy(target, e.body, wire, getattr(props, "message_id", None))))
        if self._publisher is None:
            self._publisher = ConfirmedPublisher(self._conn)
        outcomes = self._publisher.publish([c for _, c in sent])
        for (e, c), why in zip(sent, outcomes, strict=True):
            if why is not None:
                self._failed(e, res, c.target, why)
            elif self._holds(e, res):  # confirmed: only now the dead letter may go
                self._slots[e.dlq][e.slot].ch.basic_ack(e.method.delivery_tag)
                self._done(e, res, c.target, who)
            else:  # its channel closed meanwhile: the broker requeued it, the copy is out
                line = f"{_now()} replayed to {c.target}; the dead letter went back first"
                self.store.note(e.dl.message_id, line)

    def _done(self, e: Entry, res: ActionResult, target: str | None, who: str) -> None:
        self.store.remove([e.id])
        self._settled[e.dlq] += 1
        res.done += 1
        if target is not None:
            res.targets[target] = res.targets.get(target, 0) + 1
        what = f"replayed to {target}" if target else "deleted"
        self.store.note(e.dl.message_id, f"{_now()} {what} by {who}")

    def _failed(self, e: Entry, res: ActionResult, target: str, why: str) -> None:
        self.store.release([e])
        res.failed += 1
        res.errors.append(f"{e.dl.message_id or '?'} -> {target}: {why}")

    # -- the holder's thread --------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._session()
            except BaseException as exc:
                text = mask_text(f"{type(exc).__name__}: {exc}")
                if not self._ready.is_set():  # could not start: start() raises it
                    self.failure = exc
                    self._ready.set()
                    return
                log.warning("ackkit console: connection lost (%s); reconnecting", text)
                self.store.error(f"connection lost: {text}")
                self._rotation.advance()  # the next node address first (one: the same)
            finally:
                self._close()
                for q, slots in self._slots.items():
                    for k, s in enumerate(slots):
                        self.store.drop_channel(q, k, s.generation)
                self._fail_pending()
            self._stop.wait(2.0)

    def _session(self) -> None:
        self._connected = False
        self._conn = connect_in_turn(
            self._rotation,
            lambda u: blocking_connection(parameters(u, name=self.name)),
            final=(
                pika.exceptions.ProbableAuthenticationError,
                pika.exceptions.ProbableAccessDeniedError,
            ),
            what="ackkit console",
        )
        self.url = self._rotation.current
        self._phase = "checking that the dead-letter queues exist"
        self._connected = True
        probe = self._conn.channel()
        for q in self.dlqs:
            try:
                ok = probe.queue_declare(q, passive=True)
            except pika.exceptions.ChannelClosedByBroker:
                raise LookupError(f"no queue {q!r} on the broker") from None
            self._settled[q], self._last_delivery[q] = 0, time.monotonic()
            self._indexed.discard(q)
            self.at_connect[q] = int(ok.method.message_count)
            self.ready_counts[q] = None  # asked again once the console consumes
        probe.close()
        gens = {q: [s.generation for s in self._slots.get(q, ())] for q in self.dlqs}
        self._slots = {}
        for q in self.dlqs:
            n = -(-self.max_held // SLOT_MAX)
            self._slots[q] = []
            for k in range(n):
                self._phase = f"waiting for the broker to start delivering {q} (basic.consume)"
                gen = gens[q][k] + 1 if k < len(gens[q]) else 1
                self._slots[q].append(self._open(q, k, gen))
        self._ready.set()
        counted = 0.0
        while not self._stop.is_set():
            self._conn.process_data_events(time_limit=0.05)
            self._do_work()
            self._check_slots()
            if time.monotonic() - counted > 2.0:
                self._count()
                counted = time.monotonic()

    def _open(self, q: str, k: int, gen: int) -> _Slot:
        ch = self._conn.channel()
        prefetch = min(SLOT_MAX, self.max_held - k * SLOT_MAX)
        ch.basic_qos(prefetch_count=prefetch)
        slot = _Slot(ch, gen, prefetch)
        ch.add_on_cancel_callback(lambda _frame: setattr(slot, "cancelled", True))
        ch.basic_consume(q, partial(self._on_message, q, k, gen), auto_ack=False)
        return slot

    def _on_message(
        self, q: str, k: int, gen: int, _ch: Any, method: Any, props: Any, body: bytes
    ) -> None:
        dl = describe(
            getattr(props, "headers", None),
            message_id=getattr(props, "message_id", None),
            body_size=len(body),
            redelivered=method.redelivered,
            unreadable=frames.unreadable(method, props),
        )
        self._last_delivery[q] = time.monotonic()
        if getattr(props, "wire_headers", None) is not None:
            # the raw header bytes a faithful copy would reuse: a replay writes new
            # headers anyway (replay_headers), so they would only cost memory here
            props.wire_headers = None
        self.store.add(q, k, gen, method, dl, props, body, group_key(q, dl))

    def _check_slots(self) -> None:
        """A holding channel the broker closed or cancelled (e.g. a consumer timeout):
        what it held went back to the queue; forget it and hold again."""
        for q, slots in self._slots.items():
            for k, s in enumerate(slots):
                if s.ch.is_open and not s.cancelled:
                    continue
                self.store.error(f"{q}: holding channel {k} closed or cancelled; holding again")
                if s.ch.is_open:
                    with contextlib.suppress(pika.exceptions.AMQPError):
                        s.ch.close()
                self.store.drop_channel(q, k, s.generation)
                slots[k] = self._open(q, k, s.generation + 1)

    def _count(self) -> None:
        ch = self._conn.channel()
        try:
            for q in self.dlqs:
                ok = ch.queue_declare(q, passive=True)
                self.ready_counts[q] = int(ok.method.message_count)
        finally:
            if ch.is_open:
                ch.close()

    def _next_work(self) -> tuple[Callable[[], Any], Future[Any]] | None:
        """The next call waiting for the I/O thread, or None when none waits."""
        try:
            return self._work.get_nowait()
        except queue.Empty:
            return None

    def _do_work(self) -> None:
        while (work := self._next_work()) is not None:
            fn, fut = work
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                fut.set_result(fn())
            except (pika.exceptions.AMQPConnectionError, pika.exceptions.StreamLostError) as exc:
                fut.set_exception(exc)
                raise
            except BaseException as exc:
                fut.set_exception(exc)

    def _fail_pending(self) -> None:
        while (work := self._next_work()) is not None:
            _fn, fut = work
            if fut.set_running_or_notify_cancel():
                fut.set_exception(ConnectionError("the console lost its broker connection"))

    def _close(self) -> None:
        self._publisher = None
        if self._conn is not None and self._conn.is_open:
            with contextlib.suppress(Exception):
                self._conn.close()
        self._conn = None
