"""ListenerCore: every settlement decision for one listener, without I/O."""

from __future__ import annotations

import dataclasses
import datetime as _dt
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from . import headers as H
from . import outcome as _outcome
from .actions import Ack, Action, Nack, Reinvoke, Reject, Republish, TxCommit, TxSelect
from .errors import (
    AlreadySettled,
    BadPayload,
    DeadLetterMessage,
    RejectMessage,
    RequeueMessage,
    RetryLater,
    SettleNotAllowed,
)
from .events import HOT_STAGES, Counters, Event, Observer, Stage
from .outcome import Outcome
from .policy import AckMode, ListenerPolicy, RetryStrategy, Unsettled
from .tb import format_traceback, text_of
from .window import IN_FLIGHT, TagWindow

_BATCHED = (AckMode.AUTO, AckMode.DUPS_OK, AckMode.TRANSACTED)
_HANDLER_SETTLES = (AckMode.MANUAL, AckMode.CLIENT, AckMode.INDIVIDUAL)
MAX_NACKS_IN_ROW = 3
"""Copies in a row the broker may nack (each requeueing its original) before a failed
copy is replaced by a minimal one and then the original rejected (ListenerCore._copy_failed)."""


class Tracked:
    """The core's record of one delivery. Runtimes hold it inside their Delivery."""

    __slots__ = (
        "attempt",
        "carry",
        "exchange",
        "first_failure",
        "generation",
        "headers",
        "message_id",
        "parked",
        "payload",
        "routing_key",
        "settled",
        "tag",
        "verdict",
    )

    def __init__(
        self,
        tag: int,
        generation: int,
        attempt: int,
        headers: Mapping[str, Any] | None,
        exchange: str,
        routing_key: str,
        message_id: str | None = None,
    ) -> None:
        self.tag = tag
        self.generation = generation
        self.attempt = attempt
        self.headers = headers
        self.exchange = exchange
        self.routing_key = routing_key
        self.message_id = message_id
        # Headers set on every copy republished for this delivery (retry, dead letter):
        # e.g. the trace context of the span that handled it.
        self.carry: Mapping[str, Any] | None = None
        self.settled = False
        self.parked = False
        self.payload: Any = None  # the runtime's own object for this delivery (opaque here)
        self.verdict: list[Action] | None = None
        self.first_failure: str | None = None  # in-process retries: when attempt 1 failed

    def attach(self, payload: Any) -> None:
        """Attach the runtime's object for this delivery (its Delivery).

        A verdict decided in `receive()` (dead-letter a forged attempt header, or a
        redelivery past max attempts) was made before the runtime had built that
        object; its Republish actions get it here as their source.
        """
        self.payload = payload
        if self.verdict:
            self.verdict = [
                dataclasses.replace(a, source=payload)
                if isinstance(a, Republish) and a.source is None
                else a
                for a in self.verdict
            ]

    def __repr__(self) -> str:
        return f"Tracked(tag={self.tag}, gen={self.generation}, attempt={self.attempt})"


@dataclass(frozen=True, slots=True)
class QueueSpec:
    """A queue the listener needs (dead-letter queue, delay tier); declared idempotently."""

    name: str
    arguments: dict[str, Any]
    purpose: str


def missing_queue(name: str) -> str:
    """Why start() fails when a listener's declare=False queue does not exist."""
    return (
        f"queue {name!r} does not exist, and its listener has declare=False: declare the "
        "queue first, or let ackkit declare it (declare=True)"
    )


def _iso(ts: float) -> str:
    return _dt.datetime.fromtimestamp(ts, _dt.timezone.utc).isoformat(timespec="milliseconds")


class ListenerCore:
    """Decisions for one listener on one channel at a time.

    A runtime calls: `channel_opened()` when its channel for this listener is
    open, `receive()` per delivery, `finish()` when the handler returned or
    raised, `settle()` for handler-driven acks, `republished()` when a
    confirm for a Republish arrived, `tick()` periodically, `drain()` before
    cancel/close, `channel_closed()` when the channel is gone. Each returns
    actions to carry out in order on the current channel.
    """

    def __init__(
        self,
        policy: ListenerPolicy,
        *,
        clock: Callable[[], float] = time.monotonic,
        wallclock: Callable[[], float] = time.time,
        observer: Observer | None = None,
        shared_channel: bool = False,
    ) -> None:
        self.policy = policy
        # Other consumers take tags on this core's channel (pull mode: one channel, one
        # core per queue): a multiple frame never covers a tag this core did not receive.
        self.shared_channel = shared_channel
        self.mode = policy.mode
        self._flush = policy.flush_policy
        self._clock = clock
        self._wallclock = wallclock
        self.observer = observer
        # RECEIVED and ACKED happen once per healthy message: emitted only to observers
        # that want them (see Observer).
        self._hot = observer is not None and getattr(observer, "hot", True)
        self.counters = Counters()
        self.generation = 0
        self.open = False
        self._window = TagWindow(self.shared_channel)
        self._tracked: dict[int, Tracked] = {}
        self._republishing: dict[int, Tracked] = {}
        self._republish_acts: dict[int, Republish] = {}
        self._token = 0
        self._parked = 0
        self._last_flush = clock()
        self._declared: set[str] = set()
        self._trust_count = H.broker_counts_deliveries(policy.queue_type)
        self._nacked_in_row = 0

    # -- topology ---------------------------------------------------------

    def topology(self) -> list[QueueSpec]:
        """Queues ackkit declares for this listener: the DLQ and the retry delay tiers."""
        p = self.policy
        specs = []
        dlq = p.dead_letter_queue
        if dlq is not None:
            specs.append(QueueSpec(dlq, {}, "dead-letter"))
        if p.retry.strategy is RetryStrategy.BROKER and p.retry.max_attempts > 1:
            for ms in p.retry.delay_tiers_ms():
                specs.append(self._delay_spec(ms))
        return specs

    def _delay_spec(self, ms: int) -> QueueSpec:
        args: dict[str, Any] = {
            "x-message-ttl": ms,
            "x-dead-letter-exchange": "",
            "x-dead-letter-routing-key": self.policy.queue,
        }
        if self.policy.queue_type == "quorum":
            # A classic queue dead-letters at-most-once: copies waiting in it when the
            # broker restarted never made it back into a quorum queue (the chaos run
            # lost 90 poison messages that way). A quorum queue with this strategy
            # keeps each copy until the origin queue has it (RabbitMQ 3.10+).
            args["x-queue-type"] = "quorum"
            args["x-dead-letter-strategy"] = "at-least-once"
            args["x-overflow"] = "reject-publish"  # at-least-once needs it
        return QueueSpec(self.policy.delay_queue(ms), args, "retry-delay")

    def extra_delay_queue(self, delay: float) -> QueueSpec | None:
        """The delay queue a RetryLater(delay=...) needs, if it is not one of the tiers."""
        ms = _round_delay_ms(delay)
        name = self.policy.delay_queue(ms)
        if name in self._declared or ms in self.policy.retry.delay_tiers_ms():
            return None
        return self._delay_spec(ms)

    def declared(self, name: str) -> None:
        self._declared.add(name)

    # -- channel lifecycle -----------------------------------------------

    def channel_opened(self) -> list[Action]:
        self.generation += 1
        self.open = True
        self._window = TagWindow(self.shared_channel)
        self._tracked = {}
        self._parked = 0
        self._last_flush = self._clock()
        return [TxSelect()] if self.mode is AckMode.TRANSACTED else []

    def channel_closed(self) -> int:
        """The channel is gone: every outstanding delivery of it is now stale.

        Returns how many deliveries had not been acked; the broker has requeued them.
        """
        self.open = False
        n = len(self._tracked)
        # Their handlers may still settle them: that is dropped (and counted) then.
        self._tracked = {}
        self._window = TagWindow(self.shared_channel)
        self._parked = 0
        return n

    # -- deliveries -------------------------------------------------------

    def receive(
        self,
        tag: int,
        redelivered: bool = False,
        headers: Mapping[str, Any] | None = None,
        exchange: str = "",
        routing_key: str = "",
        message_id: str | None = None,
        unreadable: str | None = None,
    ) -> Tracked:
        """Track a delivery. If `verdict` is set on the result, do not run the handler:
        carry out the verdict's actions instead.

        `unreadable`: the client library could not decode the delivery's properties
        (why, in words). Such a delivery never reaches a handler: it is dead-lettered
        (the copy carries its body, the properties the runtime could salvage, e.g. its
        message_id, and ackkit's reason), or rejected without requeue when the
        listener has no dead-letter queue, so the queue's own dead-letter route takes
        it whole.
        """
        trust = self._trust_count
        try:
            attempt = H.attempt_of(headers, redelivered, trust_count=trust)
            bad: str | None = None
        except H.BadAttemptHeader as exc:
            attempt, bad = 1, str(exc)
        t = Tracked(tag, self.generation, attempt, headers, exchange, routing_key, message_id)
        c = self.counters.counts
        c[Stage.RECEIVED] += 1
        if self._hot:
            self._emit(Stage.RECEIVED, t, "", count=False)
        if self.mode is AckMode.NONE:
            t.settled = True
            if unreadable is not None:
                t.settled = False
                t.verdict = self._unreadable(t, unreadable)
            return t
        self._window.add(tag)
        self._tracked[tag] = t
        if unreadable is not None:
            t.verdict = self._unreadable(t, unreadable)
        elif bad is not None:
            t.verdict = self._dead_letter(t, bad, BadPayload(bad), None)
        else:
            mx = self.policy.retry.max_attempts
            if mx > 1 and attempt > mx:
                # Redelivered after consumer loss with its attempts used up: a message
                # that kills its consumer must not loop (Celery's reject_on_worker_lost).
                t.verdict = self._dead_letter(
                    t,
                    f"attempts exhausted ({attempt - 1} of {mx}, last one lost)",
                    None,
                    None,
                    attempts=attempt - 1,  # this delivery never reaches the handler
                )
            elif mx > 1 and redelivered and not trust:
                # No header the broker maintains says how often this copy was delivered:
                # a copy carrying the attempt number goes back instead (a header a
                # producer wrote can never turn this counting off).
                t.verdict = [self._restamp(t)]
        return t

    def _unreadable(self, t: Tracked, why: str) -> list[Action]:
        reason = f"unreadable message: {why}"
        if self.policy.dead_letter_queue is None:
            if self.mode is AckMode.NONE:
                self._emit(Stage.REJECTED, t, f"lost (no-ack, no DLQ): {reason}")
                t.settled = True
                return []
            self._take(t)
            self._window.mark_gone(t.tag)
            self._emit(Stage.REJECTED, t, reason)
            return [Reject(t.tag, requeue=False)]
        return self._dead_letter(t, reason, None, None)

    def finish(
        self, t: Tracked, exc: BaseException | None = None, traceback: str | None = None
    ) -> list[Action]:
        """The handler returned (exc None) or raised `exc`.

        `traceback` may be left None: a dead letter formats it from
        `exc.__traceback__` (retries never need it).
        """
        if self.mode is AckMode.NONE:
            # The broker already forgot the message; a copy in the DLQ is the only net left.
            if exc is None or self.policy.dead_letter_queue is None:
                if exc is not None:
                    self._emit(Stage.REJECTED, t, f"lost (no-ack, no DLQ): {_describe(exc)}")
                return []
            return self._dead_letter(t, f"handler failed: {_describe(exc)}", exc, traceback)
        if t.settled:
            return []
        if t.generation != self.generation or not self.open:
            t.settled = True
            self._emit(Stage.DROPPED_STALE, t, "channel closed")
            return []
        if exc is None:
            if self.mode in _BATCHED:
                return self._ack(t)
            return self._unsettled(t)
        if self.mode is AckMode.TRANSACTED:
            return self._requeue_pending("transaction rolled back") + self._failure(
                t, exc, traceback
            )
        return self._failure(t, exc, traceback)

    def finish_batch(
        self,
        batch: Sequence[Tracked],
        done: int,
        exc: BaseException | None = None,
        traceback: str | None = None,
    ) -> list[Action]:
        """A batch handler returned or raised (RocketMQ's ackIndex).

        The first `done` deliveries succeeded. The rest failed with `exc` when the
        handler raised; when it returned a partial success they were not processed,
        which counts as a retry request (RetryLater), bounded by max attempts.
        """
        later = RetryLater("not acknowledged by the batch handler (AckIndex)")
        acts: list[Action] = []
        for i, t in enumerate(batch):
            if i < done:
                acts.extend(self.finish(t))
            elif exc is not None:
                acts.extend(self.finish(t, exc, traceback))
            else:
                acts.extend(self.finish(t, later))
        return acts

    def handled(
        self,
        batch: Sequence[Tracked],
        result: object = None,
        exc: BaseException | None = None,
        *,
        is_batch: bool = False,
        undecodable: Sequence[tuple[Tracked, BaseException]] = (),
        traceback: str | None = None,
    ) -> Outcome:
        """A handler ran for `batch` (one delivery, or a batch) and returned `result` or
        raised `exc` (any exception, interpreter-exit signals included): what it comes
        to. See `outcome.handled`."""
        return _outcome.handled(
            self,
            batch,
            result,
            exc,
            is_batch=is_batch,
            undecodable=undecodable,
            traceback=traceback,
        )

    def settle(
        self, t: Tracked, kind: str, *, requeue: bool = False, multiple: bool = False
    ) -> list[Action]:
        """The handler settles `t` itself: kind is 'ack', 'nack' or 'reject'."""
        if self.mode is AckMode.NONE:
            raise SettleNotAllowed(
                f"AckMode.NONE: the broker settled this delivery when it sent it; nothing to {kind}"
            )
        if t.settled:
            raise AlreadySettled(f"delivery tag {t.tag} was already settled")
        if multiple and self.mode is AckMode.INDIVIDUAL:
            raise SettleNotAllowed("AckMode.INDIVIDUAL settles one delivery at a time")
        if t.generation != self.generation or not self.open:
            # Its channel is gone and the broker has requeued it: never send its tag.
            t.settled = True
            self._emit(Stage.DROPPED_STALE, t, "channel closed before settle")
            return []
        if kind == "ack":
            if multiple or self.mode is AckMode.CLIENT:
                return self._ack_upto(t.tag)
            return self._ack(t)
        if kind not in ("nack", "reject"):
            raise ValueError(f"unknown settle kind {kind!r}")
        # A multiple frame covers every outstanding tag up to t.tag at the broker; it may
        # only go out when each of them is one of ours to settle now. A delivery already
        # decided (its retry or dead-letter copy awaiting the broker's confirm) must not
        # be requeued under it: the copy and the requeued original would both live on.
        covered = set(self._window.in_flight_upto(t.tag)) if multiple else set()
        targets = self._take_upto(t.tag) if multiple else [self._take(t)]
        acts: list[Action] = []
        if requeue:
            if multiple and covered == {x.tag for x in targets} and self._window.may_cover(t.tag):
                acts.extend(self._flush_acks(force=True))
                self._window.mark_gone_upto(t.tag)
                acts.append(Nack(t.tag, multiple=True, requeue=True))
            else:
                for x in targets:
                    self._window.mark_gone(x.tag)
                    acts.append(Nack(x.tag) if kind == "nack" else Reject(x.tag, requeue=True))
            for x in targets:
                self._emit(Stage.REQUEUED, x, f"{kind} requeue by handler")
            return acts
        for x in targets:
            x.settled = False  # _dead_letter settles it
            acts.extend(self._dead_letter(x, f"{kind} without requeue by handler", None, None))
        return acts

    def current(self, generation: int) -> bool:
        """Do actions decided for channel generation `generation` still belong on the
        listener's channel (it is open and is that generation)?"""
        return generation == self.generation and self.open

    def publishable(self, token: int) -> bool:
        """May the copy a Republish asks for still be published (just before sending it)?

        Not when the original's channel has closed since the action was decided: the
        broker has requeued the original, which will be delivered and decided again,
        so a copy published now would be a duplicate (a second retry lineage, a second
        dead letter). Report such a token with `republished(token, ok=False)`.
        """
        t = self._republishing.get(token)
        if t is None:
            return False
        if self.mode is AckMode.NONE:
            return True  # the broker forgot the original on send: the copy is all there is
        return t.generation == self.generation and self.open

    def republished(
        self, token: int, ok: bool, *, unroutable: bool = False, error: str | None = None
    ) -> list[Action]:
        """The broker confirmed (ok) or refused a Republish: settle the original.

        `unroutable`: the copy came back with basic.return (no queue bound): if
        the target is one of ackkit's own queues it is declared and the copy
        published once more. `error`: the copy could not be sent at all (the
        client library raised while encoding or publishing it; why, in words).

        A copy that failed is never retried forever (see `_copy_failed`): a broker
        nack of a healthy copy requeues the original a few times in a row; any other
        failure (or too many nacks) gets one minimal copy (body and ackkit's headers),
        and when that fails too the original is rejected without requeue.
        """
        t = self._republishing.pop(token, None)
        act = self._republish_acts.pop(token, None)
        if t is None:
            return []
        if t.generation != self.generation and self.mode is AckMode.NONE:
            return []
        if t.generation != self.generation or not self.open:
            self._emit(Stage.DROPPED_STALE, t, "channel closed before the republish confirm")
            return []
        if not ok and unroutable and act is not None:
            again = self._republish_declaring(t, act)
            if again is not None:
                return [again]
        if self.mode is AckMode.NONE:
            if not ok:
                self._emit(Stage.REJECTED, t, "lost: no-ack delivery and the DLQ publish failed")
            return []
        if not ok:
            return self._copy_failed(t, act, unroutable, error)
        self._nacked_in_row = 0
        if self.mode is AckMode.TRANSACTED:
            return self._ack(t, count=False)
        return self._ack_now(t)

    def _copy_failed(
        self, t: Tracked, act: Republish | None, unroutable: bool, error: str | None
    ) -> list[Action]:
        """The bounded rule for a copy that was not published.

        1. The broker refused a copy that was sent (a nack, e.g. a full delay queue
           that rejects publishes; or returned although its queue was just declared):
           the original is requeued, while at most MAX_NACKS_IN_ROW copies in a row
           were refused on this listener (a confirmed copy resets the count).
        2. Otherwise (not encodable, the client raised, or refused too often):
           one more copy, minimal (the body and ackkit's headers; the original's
           properties and headers left off), to the same queue.
        3. A minimal copy that fails: the original is rejected without requeue
           (the queue's own dead-letter exchange takes it, if it has one).
        """
        if error is None:
            why = "returned by the broker (unroutable)" if unroutable else "nacked by the broker"
            self._nacked_in_row += 1
            if self._nacked_in_row <= MAX_NACKS_IN_ROW:
                self._window.mark_gone(t.tag)
                self._emit(Stage.REQUEUED, t, f"copy {why}")
                return [Reject(t.tag, requeue=True)]
        else:
            why = error
        if act is not None and not act.minimal:
            self._token += 1
            hdrs = {**act.set_headers, H.COPY_NOTE: f"minimal copy: the full copy failed: {why}"}
            again = dataclasses.replace(
                act, token=self._token, minimal=True, set_headers=hdrs, source=t.payload
            )
            self._republishing[self._token] = t
            self._republish_acts[self._token] = again
            return [again]
        purpose = act.purpose if act is not None else "republished"
        self._window.mark_gone(t.tag)
        self._emit(
            Stage.REJECTED,
            t,
            f"{purpose} copy could not be published ({why}), not even a minimal one",
        )
        return [Reject(t.tag, requeue=False)]

    def _ack_now(self, t: Tracked) -> list[Action]:
        """Ack `t` at once, not with the next batch: its copy is confirmed, and until
        this ack reaches the broker a lost connection leaves both (a duplicate)."""
        self._take(t)
        w = self._window
        w.mark_ack(t.tag)
        top, n = w.take_prefix()
        acts: list[Action] = []
        if n:
            acts.append(Ack(top, multiple=n > 1))
            self.counters.ack_frame(n)
        if top < t.tag:  # an earlier delivery is still in flight: this one alone
            w.mark_gone(t.tag)
            acts.append(Ack(t.tag))
            self.counters.ack_frame(1)
        return acts

    def _republish_declaring(self, t: Tracked, act: Republish) -> Republish | None:
        """A refused copy to one of our own queues: publish it once more, declaring the
        queue first. The usual cause is the queue having been deleted while we run
        (every copy comes back unroutable); requeueing the original would then loop
        through the handler as fast as the broker can redeliver."""
        if act.declare is not None:
            return None  # declared and still refused: requeue
        spec = self._own_queue(act.routing_key)
        if spec is None:
            return None
        self._token += 1
        declare = (spec.name, spec.arguments)
        again = dataclasses.replace(act, token=self._token, declare=declare, source=t.payload)
        self._republishing[self._token] = t
        self._republish_acts[self._token] = again
        return again

    def _own_queue(self, name: str) -> QueueSpec | None:
        for spec in self.topology():
            if spec.name == name:
                return spec
        prefix = self.policy.delay_queue(0)[: -len("0ms")]
        ms = name[len(prefix) : -2]
        if name.startswith(prefix) and name.endswith("ms") and ms.isdigit():
            return self._delay_spec(int(ms))
        return None

    def startable(self, t: Tracked) -> bool:
        """May a handler start on `t` now (called just before)? Not when its channel closed
        since it was delivered: the broker has requeued it, so running the handler would
        only duplicate the work its redelivery will do (and delay that redelivery)."""
        if self.mode is AckMode.NONE:
            return True  # the broker forgot it on send: this is the only chance
        if t.settled:
            return False
        if t.generation != self.generation or not self.open:
            t.settled = True
            self._emit(Stage.DROPPED_STALE, t, "channel closed before the handler started")
            return False
        return True

    def release(self, t: Tracked) -> list[Action]:
        """Return a prefetched delivery whose handler never started (shutdown)."""
        if t.settled or t.generation != self.generation or not self.open:
            return []
        t.settled = True
        self._tracked.pop(t.tag, None)
        self._window.mark_gone(t.tag)
        self._emit(Stage.RETURNED, t, "shutdown before start")
        return [Nack(t.tag, requeue=True)]

    # -- time and shutdown -------------------------------------------------

    def tick(self) -> list[Action]:
        """Call periodically (e.g. every 50 ms): sends acks held longer than the interval."""
        if not self._window.pending:
            self._last_flush = self._clock()
            return []
        if self._clock() - self._last_flush >= self._flush.interval:
            return self._flush_acks(force=True)
        return []

    def drain(self) -> list[Action]:
        """Send every pending ack now (before basic.cancel and channel close)."""
        if not self.open:
            return []
        return self._flush_acks(force=True)

    @property
    def pending_acks(self) -> int:
        return self._window.pending

    @property
    def outstanding(self) -> int:
        return len(self._tracked)

    @property
    def republishing(self) -> int:
        return len(self._republishing)

    def unsettled(self) -> list[Tracked]:
        return [t for t in self._tracked.values() if not t.settled]

    # -- internals ---------------------------------------------------------

    def _emit(self, stage: Stage, t: Tracked, reason: str, count: bool = True) -> None:
        if count:
            self.counters.counts[stage] += 1
        if self.observer and (self._hot or stage not in HOT_STAGES):
            ev = Event(stage, self.policy.name, t.tag, t.attempt, reason, t.message_id)
            self.observer(ev)

    def _take(self, t: Tracked) -> Tracked:
        t.settled = True
        self._tracked.pop(t.tag, None)
        if t.parked:
            t.parked = False
            self._parked -= 1
        return t

    def _take_upto(self, tag: int) -> list[Tracked]:
        out = []
        for x in self._window.in_flight_upto(tag):
            y = self._tracked.get(x)
            if y is not None:
                out.append(self._take(y))
        return out

    def _ack(self, t: Tracked, count: bool = True) -> list[Action]:
        self._take(t)
        if count:
            self.counters.counts[Stage.ACKED] += 1
            if self._hot:
                self._emit(Stage.ACKED, t, "", count=False)
        w = self._window
        w.mark_ack(t.tag)
        if w.pending >= self._flush.max_pending:
            return self._flush_acks(force=False)
        return []

    def _ack_upto(self, tag: int) -> list[Action]:
        for x in self._take_upto(tag):
            self._window.mark_ack(x.tag)
            self._emit(Stage.ACKED, x, "")
        return self._flush_acks(force=self._window.pending >= self._flush.max_pending)

    def _flush_acks(self, force: bool) -> list[Action]:
        w = self._window
        self._last_flush = self._clock()
        top, n = w.take_prefix()
        acts: list[Action] = []
        if n:
            acts.append(Ack(top, multiple=n > 1))
            self.counters.ack_frame(n)
        if w.pending and (force or w.pending >= self._flush.max_pending):
            for s in w.take_stragglers():
                acts.append(Ack(s))
                self.counters.ack_frame(1)
        if acts and self.mode is AckMode.TRANSACTED:
            acts.append(TxCommit())
        return acts

    def _requeue_pending(self, reason: str) -> list[Action]:
        acts: list[Action] = []
        for tag in self._window.take_stragglers():
            acts.append(Reject(tag, requeue=True))
            self.counters.counts[Stage.ACKED] -= 1
            self.counters.counts[Stage.REQUEUED] += 1
        return acts

    def _unsettled(self, t: Tracked) -> list[Action]:
        if self.mode is AckMode.CLIENT:
            # May be settled later by a multiple ack; only a full window is a problem.
            if not t.parked:
                t.parked = True
                self._parked += 1
            if self.policy.prefetch and self._parked >= self.policy.prefetch:
                acts: list[Action] = []
                for x in [x for x in self._tracked.values() if x.parked]:
                    acts.extend(self._apply_unsettled(x, "window full of unsettled deliveries"))
                return acts
            return []
        return self._apply_unsettled(t, "handler returned without settling")

    def _apply_unsettled(self, t: Tracked, why: str) -> list[Action]:
        self._emit(Stage.UNSETTLED, t, why)
        how = self.policy.on_unsettled
        if how is Unsettled.ACK:
            return self._ack(t)
        if how is Unsettled.REQUEUE:
            self._take(t)
            self._window.mark_gone(t.tag)
            self._emit(Stage.REQUEUED, t, why)
            return [Reject(t.tag, requeue=True)]
        return self._dead_letter(t, why, None, None)

    def _failure(self, t: Tracked, exc: BaseException, tb: str | None) -> list[Action]:
        if isinstance(exc, RequeueMessage):
            self._take(t)
            self._window.mark_gone(t.tag)
            self._emit(Stage.REQUEUED, t, exc.reason)
            return [Reject(t.tag, requeue=True)]
        if isinstance(exc, RejectMessage):
            if self.policy.dead_letter_queue is None:
                self._take(t)
                self._window.mark_gone(t.tag)
                self._emit(Stage.REJECTED, t, exc.reason)
                return [Reject(t.tag, requeue=False)]
            return self._dead_letter(t, exc.reason, exc, tb)
        if isinstance(exc, DeadLetterMessage):
            return self._dead_letter(t, exc.reason, exc, tb)
        retry = self.policy.retry
        if isinstance(exc, BadPayload):
            return self._dead_letter(t, f"bad payload: {exc}", exc, tb)
        wants = isinstance(exc, RetryLater) or retry.should_retry(exc)
        if not wants:
            return self._dead_letter(t, f"non-retryable {type(exc).__name__}", exc, tb)
        if t.attempt >= retry.max_attempts:
            why = f"attempts exhausted ({t.attempt} of {retry.max_attempts})"
            return self._dead_letter(t, why, exc, tb)
        asked = _asked_delay(exc)
        self._emit(Stage.RETRYING, t, _describe(exc))
        if retry.strategy is RetryStrategy.IN_PROCESS:
            if t.first_failure is None:
                t.first_failure = _iso(self._wallclock())
            t.attempt += 1
            delay = asked if asked is not None else retry.jittered(t.attempt - 1)
            return [Reinvoke(t.tag, delay, t.attempt)]
        # Broker delays come in fixed TTL tiers (one delay queue each); jitter does not apply.
        ms = retry.tier_for(t.attempt) if asked is None else _round_delay_ms(asked)
        extra = self.extra_delay_queue(ms / 1000) if asked is not None else None
        now = _iso(self._wallclock())
        hdrs: dict[str, Any] = {
            H.ATTEMPT: t.attempt + 1,
            # The copy is a new message: a quorum queue's count of this copy's
            # deliveries must not come along (it would be counted twice).
            H.X_DELIVERY_COUNT: None,
            H.LAST_FAILURE: now,
            H.ERROR_TYPE: _qualname(exc),
            H.ERROR_MESSAGE: _bounded(text_of(exc), 1000),
        }
        if not (t.headers and H.FIRST_FAILURE in t.headers):
            hdrs[H.FIRST_FAILURE] = now
        if not (t.headers and H.ORIGINAL_EXCHANGE in t.headers):
            hdrs[H.ORIGINAL_EXCHANGE] = t.exchange
            hdrs[H.ORIGINAL_ROUTING_KEY] = t.routing_key
        act = self._republish(t, self.policy.delay_queue(ms), hdrs, "retry")
        if extra is not None:
            self._declared.add(extra.name)
            declare = (extra.name, extra.arguments)
            act = dataclasses.replace(act, declare=declare)
            self._republish_acts[act.token] = act
        return [act]

    def _dead_letter(
        self,
        t: Tracked,
        reason: str,
        exc: BaseException | None,
        tb: str | None,
        attempts: int | None = None,
    ) -> list[Action]:
        dlq = self.policy.dead_letter_queue
        if dlq is None:
            self._take(t)
            self._window.mark_gone(t.tag)
            self._emit(Stage.REJECTED, t, reason)
            return [Reject(t.tag, requeue=False)]
        now = _iso(self._wallclock())
        old = t.headers or {}
        hdrs: dict[str, Any] = {
            H.REASON: _bounded(reason, 1000),
            H.ATTEMPTS: t.attempt if attempts is None else attempts,
            H.LISTENER: self.policy.name,
            H.ORIGINAL_QUEUE: self.policy.queue,
            H.ORIGINAL_EXCHANGE: old.get(H.ORIGINAL_EXCHANGE, t.exchange),
            H.ORIGINAL_ROUTING_KEY: old.get(H.ORIGINAL_ROUTING_KEY, t.routing_key),
            H.FIRST_FAILURE: old.get(H.FIRST_FAILURE) or t.first_failure or now,
            H.LAST_FAILURE: now,
            H.DEAD_LETTERED_AT: now,
            H.X_DELIVERY_COUNT: None,
        }
        if exc is not None:
            hdrs[H.ERROR_TYPE] = _qualname(exc)
            hdrs[H.ERROR_MESSAGE] = _bounded(text_of(exc), 1000)
        if tb is None and exc is not None and exc.__traceback__ is not None:
            tb = format_traceback(exc)  # only dead letters need it; cached per failure
        if tb:
            hdrs[H.ERROR_TRACEBACK] = tb[-self.policy.max_traceback :]
        self._emit(Stage.DEAD_LETTERED, t, reason, count=False)
        return [self._republish(t, dlq, hdrs, "dead-letter")]

    def _restamp(self, t: Tracked) -> Republish:
        """A redelivery from a queue that does not count deliveries goes back to its
        queue as a copy carrying its attempt number (then the original is acked).

        A classic queue's redelivered flag says "delivered before", not how often:
        without this, a message that kills its consumer (or holds it past the
        broker's consumer_timeout) every time would come back as attempt 2 forever.
        The copy starts at this attempt, so every further loss counts once more and
        the message reaches max_attempts and the DLQ instead of looping.
        """
        self._emit(Stage.REQUEUED, t, f"redelivered: attempt {t.attempt} stamped on a copy")
        hdrs: dict[str, Any] = {H.ATTEMPT: t.attempt, H.X_DELIVERY_COUNT: None}
        if not (t.headers and H.ORIGINAL_EXCHANGE in t.headers):
            hdrs[H.ORIGINAL_EXCHANGE] = t.exchange
            hdrs[H.ORIGINAL_ROUTING_KEY] = t.routing_key
        return self._republish(t, self.policy.queue, hdrs, "restamp")

    def _republish(self, t: Tracked, queue: str, hdrs: dict[str, Any], purpose: str) -> Republish:
        if t.carry:
            hdrs = {**t.carry, **hdrs}
        self._take(t)
        self._token += 1
        self._republishing[self._token] = t
        if purpose == "dead-letter":
            self.counters.counts[Stage.DEAD_LETTERED] += 1
        act = Republish(self._token, t.tag, "", queue, hdrs, purpose=purpose, source=t.payload)
        self._republish_acts[self._token] = act
        return act

    def reinvoked(self, t: Tracked) -> None:
        """An in-process retry is about to run the handler again (no-op hook for symmetry)."""


def _round_delay_ms(delay: float) -> int:
    ms = max(int(delay * 1000 + 0.999), 1)
    if ms > 10_000:
        return (ms + 999) // 1000 * 1000
    if ms > 1000:
        return (ms + 99) // 100 * 100
    return ms


def _qualname(exc: BaseException) -> str:
    t = type(exc)
    mod = t.__module__
    return t.__qualname__ if mod == "builtins" else f"{mod}.{t.__qualname__}"


def _bounded(s: str, n: int) -> str:
    return s if len(s) <= n else s[: n - 3] + "..."


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {_bounded(text_of(exc), 200)}"


MAX_RETRY_DELAY = 24 * 3600.0
"""The longest a RetryLater(delay=...) may ask for (seconds); longer asks are capped."""


def _asked_delay(exc: BaseException) -> float | None:
    """The delay a RetryLater asks for, made sane: None (use the policy's backoff) when
    it is not a real number, 0 when negative, at most MAX_RETRY_DELAY."""
    if not isinstance(exc, RetryLater):
        return None
    d = exc.delay
    if isinstance(d, bool) or not isinstance(d, (int, float)):
        return None
    d = float(d)
    if math.isnan(d):
        return None
    return min(max(d, 0.0), MAX_RETRY_DELAY)


def in_flight_states(core: ListenerCore) -> Iterable[int]:
    """Debug helper: tags the window still considers in flight."""
    return [t for t in core._window.in_flight() if core._window.state(t) == IN_FLIGHT]
