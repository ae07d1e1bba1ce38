"""ListenerCore: every settlement decision for one listener, without I/O.

The core is the one entry point a runtime talks to; it holds the listener's
state and turns events into actions, with its parts in their own modules:

- `ledger.Ledger`: channel generations, the tag window and when acks go out;
- `failure.decide`: what a failed delivery becomes (requeue, retry, dead-letter);
- `copy_headers`: the headers each retry, dead-letter and restamp copy carries;
- `topology`: the queues the listener needs (dead-letter queue, delay tiers);
- `republish.Confirms`: copies awaiting the broker's confirm, and what that settles.

What stays here is the lifecycle that ties them together: receive, finish,
settle, release, and the events and counters.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from . import copy_headers as CH
from . import headers as H
from . import outcome as _outcome
from . import topology as _topology
from .actions import (
    Action,
    CopyPurpose,
    Nack,
    Reinvoke,
    Reject,
    Republish,
    SettleKind,
    TxSelect,
)
from .brokers import UNKNOWN, BrokerTraits, CountSource
from .errors import AlreadySettled, BadPayload, RetryLater, SettleNotAllowed
from .events import HOT_STAGES, Counters, Event, Observer, Stage
from .failure import Fate, decide
from .ledger import Ledger
from .outcome import Outcome
from .policy import AckMode, ListenerPolicy, Unsettled
from .republish import MAX_NACKS_IN_ROW, Confirms
from .topology import QueueSpec, missing_queue
from .tracked import Tracked

__all__ = ["MAX_NACKS_IN_ROW", "ListenerCore", "QueueSpec", "Tracked", "missing_queue"]

_BATCHED = (AckMode.AUTO, AckMode.DUPS_OK, AckMode.TRANSACTED)


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
        broker: BrokerTraits = UNKNOWN,
    ) -> None:
        self.policy = policy
        # Other consumers take tags on this core's channel (pull mode: one channel, one
        # core per queue): a multiple frame never covers a tag this core did not receive.
        self.shared_channel = shared_channel
        self.mode = policy.mode
        self._wallclock = wallclock
        self.observer = observer
        # RECEIVED and ACKED happen once per healthy message: emitted only to observers
        # that want them (see Observer).
        self._hot = observer is not None and getattr(observer, "hot", True)
        self.counters = Counters()
        self.ledger = Ledger(
            policy.mode,
            policy.flush_policy,
            policy.prefetch,
            self.counters,
            clock,
            shared_channel,
        )
        self.confirms = Confirms(policy, self.ledger, self.counters, self._emit)
        self._declared: set[str] = set()
        self.broker = UNKNOWN
        self._count = CountSource.REDELIVERED
        self.use_broker(broker)
        self.stopping = False
        """The app is stopping (`stop()`): no handler starts, no retry runs again."""

    def use_broker(self, broker: BrokerTraits) -> None:
        """The connection reports this broker (called on every connect: a broker may
        have been upgraded meanwhile). Sets how attempts are counted."""
        self.broker = broker
        self._count = broker.count_source(self.policy.queue_type)

    @property
    def count_source(self) -> CountSource:
        """Where previous deliveries of a copy are counted from, on this broker."""
        return self._count

    @property
    def generation(self) -> int:
        """The current channel's generation (one more per channel opened)."""
        return self.ledger.generation

    @property
    def open(self) -> bool:
        """Is the listener's channel open now?"""
        return self.ledger.open

    # -- topology ---------------------------------------------------------

    def topology(self) -> list[QueueSpec]:
        """Queues ackkit declares for this listener: the DLQ and the retry delay tiers."""
        return _topology.topology(self.policy)

    def queue_arguments(
        self, arguments: Mapping[str, Any]
    ) -> tuple[dict[str, Any], tuple[str, ...]]:
        """The listener queue's arguments to declare on this broker, and those left off
        (see `topology.listener_arguments`)."""
        return _topology.listener_arguments(self.policy, self.broker, arguments)

    def check_broker(self) -> None:
        """Raise TopologyConflict when the listener needs what this broker lacks."""
        _topology.check_broker(self.policy, self.broker)

    def extra_delay_queue(self, delay: float) -> QueueSpec | None:
        """The delay queue a RetryLater(delay=...) needs, if it is not one of the tiers
        and not declared yet."""
        return _topology.extra_delay_queue(self.policy, delay, self._declared)

    def declared(self, name: str) -> None:
        """The runtime declared queue `name` (one not in `topology()`)."""
        self._declared.add(name)

    # -- channel lifecycle -----------------------------------------------

    def channel_opened(self) -> list[Action]:
        self.ledger.opened()
        return [TxSelect()] if self.mode is AckMode.TRANSACTED else []

    def consumer_cancelled(self) -> int:
        """The broker cancelled the listener's consumer (basic.cancel from the server).

        RabbitMQ 4.3 does this on a consumer timeout instead of closing the channel, and
        returns every delivery of the consumer to its queue; 4.3.6 keeps the consumer
        registered until the channel closes (an answer to its cancel would close the
        channel before 4.3.7). Decision: the old deliveries are fenced at once, like a
        closed channel's (their settles are dropped and counted, never sent), and the
        runtime closes this channel and consumes on a new one, where tags start afresh.
        Returns how many deliveries were outstanding.
        """
        self.counters.counts[Stage.CONSUMER_CANCELLED] += 1
        return self.ledger.closed()

    def channel_closed(self) -> int:
        """The channel is gone: every outstanding delivery of it is now stale.

        Returns how many deliveries had not been acked; the broker has requeued them.
        Their handlers may still settle them: that is dropped (and counted) then.
        """
        return self.ledger.closed()

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
        count = self._count
        try:
            attempt = H.attempt_of(headers, redelivered, count_header=count.header)
            bad: str | None = None
        except H.BadAttemptHeader as exc:
            attempt, bad = 1, str(exc)
        t = Tracked(tag, self.generation, attempt, headers, exchange, routing_key, message_id)
        self.counters.counts[Stage.RECEIVED] += 1
        if self._hot:
            self._emit(Stage.RECEIVED, t, "", count=False)
        if self.mode is AckMode.NONE:
            t.settled = True
            if unreadable is not None:
                t.settled = False
                t.verdict = self._unreadable(t, unreadable)
            return t
        self.ledger.track(t)
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
            elif mx > 1 and redelivered and count is CountSource.REDELIVERED:
                # No header the broker maintains says how often this copy was delivered:
                # a copy carrying the attempt number goes back instead (a header a
                # producer wrote can never turn this counting off).
                t.verdict = [self._restamp(t)]
        return t

    def _unreadable(self, t: Tracked, why: str) -> list[Action]:
        reason = f"unreadable message: {why}"
        if self.policy.dead_letter_queue is None and self.mode is AckMode.NONE:
            self._emit(Stage.REJECTED, t, f"lost (no-ack, no DLQ): {reason}")
            t.settled = True
            return []
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
            return [] if exc is None else self._failure(t, exc, traceback)
        if t.settled:
            return []
        if not self.ledger.current(t):
            t.settled = True
            self._emit(Stage.DROPPED_STALE, t, "channel closed")
            return []
        if exc is None:
            if self.mode in _BATCHED:
                return self._ack(t)
            return self._unsettled(t)
        if self.mode is AckMode.TRANSACTED:
            # The transaction rolls back: its pending acks become requeues.
            return self.ledger.requeue_pending() + self._failure(t, exc, traceback)
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
        if done >= len(batch) and len(batch) == 1:
            return self.finish(batch[0])  # the common case: one delivery, it succeeded
        failed = exc
        if failed is None and done < len(batch):
            failed = RetryLater("not acknowledged by the batch handler (AckIndex)")
        acts: list[Action] = []
        for i, t in enumerate(batch):
            if i < done:
                acts.extend(self.finish(t))
            else:
                acts.extend(self.finish(t, failed, traceback if exc is not None else None))
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
        """The handler settles `t` itself: kind is a SettleKind ('ack', 'nack' or 'reject')."""
        if self.mode is AckMode.NONE:
            raise SettleNotAllowed(
                f"AckMode.NONE: the broker settled this delivery when it sent it; nothing to {kind}"
            )
        if t.settled:
            raise AlreadySettled(f"delivery tag {t.tag} was already settled")
        if multiple and self.mode is AckMode.INDIVIDUAL:
            raise SettleNotAllowed("AckMode.INDIVIDUAL settles one delivery at a time")
        ledger = self.ledger
        if not ledger.current(t):
            # Its channel is gone and the broker has requeued it: never send its tag.
            t.settled = True
            self._emit(Stage.DROPPED_STALE, t, "channel closed before settle")
            return []
        try:
            how = SettleKind(kind)
        except ValueError:
            raise ValueError(f"unknown settle kind {kind!r}") from None
        if how is SettleKind.ACK:
            if multiple or self.mode is AckMode.CLIENT:
                return self._ack_upto(t.tag)
            return self._ack(t)
        # A multiple frame covers every outstanding tag up to t.tag at the broker; it may
        # only go out when each of them is one of ours to settle now. A delivery already
        # decided (its retry or dead-letter copy awaiting the broker's confirm) must not
        # be requeued under it: the copy and the requeued original would both live on.
        covered = set(ledger.window.in_flight_upto(t.tag)) if multiple else set()
        targets = ledger.take_upto(t.tag) if multiple else [ledger.take(t)]
        acts: list[Action] = []
        if requeue:
            if multiple and covered == {x.tag for x in targets} and ledger.window.may_cover(t.tag):
                acts.extend(ledger.flush(force=True))
                ledger.window.mark_gone_upto(t.tag)
                acts.append(Nack(t.tag, multiple=True, requeue=True))
            else:
                for x in targets:
                    ledger.window.mark_gone(x.tag)
                    acts.append(Nack(x.tag) if how is SettleKind.NACK else Reject(x.tag, True))
            for x in targets:
                self._emit(Stage.REQUEUED, x, f"{how} requeue by handler")
            return acts
        for x in targets:
            x.settled = False  # _dead_letter settles it
            acts.extend(self._dead_letter(x, f"{how} without requeue by handler", None, None))
        return acts

    def current(self, generation: int) -> bool:
        """Do actions decided for channel generation `generation` still belong on the
        listener's channel (it is open and is that generation)?"""
        return self.ledger.current_generation(generation)

    def startable(self, t: Tracked) -> bool:
        """May a handler start on `t` now (called just before)? Not when its channel closed
        since it was delivered: the broker has requeued it, so running the handler would
        only duplicate the work its redelivery will do (and delay that redelivery)."""
        if self.mode is AckMode.NONE:
            return True  # the broker forgot it on send: this is the only chance
        if t.settled:
            return False
        if not self.ledger.current(t):
            t.settled = True
            self._emit(Stage.DROPPED_STALE, t, "channel closed before the handler started")
            return False
        return True

    def start(self, t: Tracked) -> list[Action] | None:
        """A handler is about to start on `t`: None to go ahead; otherwise do not run it,
        carry out the returned actions (maybe none) instead. A stopping core starts
        nothing: the delivery goes back to its queue; a stale one is dropped."""
        if self.stopping:
            return self.release(t)
        return None if self.startable(t) else []

    def resume(self, rerun: Sequence[Tracked]) -> Outcome:
        """The wait before running a handler again for `rerun` (in-process retry) is over,
        or was cut short because the app stops: which of them run again now
        (`Outcome.rerun`), and the actions for the others (released when stopping)."""
        acts: list[Action] = []
        go: list[Tracked] = []
        for t in rerun:
            a = self.start(t)
            if a is None:
                go.append(t)
            else:
                acts.extend(a)
        return Outcome(acts, tuple(go))

    def release(self, t: Tracked) -> list[Action]:
        """Return a delivery whose handler never ran to the end (shutdown, cancellation)."""
        if t.settled or not self.ledger.current(t):
            return []
        self.ledger.gone(t)
        self._emit(Stage.RETURNED, t, "shutdown before start")
        return [Nack(t.tag, requeue=True)]

    # -- shutdown ------------------------------------------------------------

    def stop(self) -> list[Action]:
        """The app stops (call once its consumer is cancelled, or as the cancel goes
        out): from now on no handler starts (`start` releases the delivery), and a
        delivery waiting to be retried in process is released instead (`handled`,
        `resume`). Returns the acks held back, to send now."""
        self.stopping = True
        return self.ledger.drain()

    @property
    def quiescent(self) -> bool:
        """Stopping, and the core waits for nothing more: no copy awaits the broker's
        confirm and no ack is held back (or the channel is gone, and with it every
        tag). A handler still running past the shutdown timeout does not count: its
        delivery is the broker's to requeue when the channel closes."""
        if not self.stopping:
            return False
        return not self.ledger.open or (not self.confirms and self.ledger.pending == 0)

    @property
    def busy(self) -> int:
        """Deliveries received and not decided yet (queued for, or in, a handler)."""
        return sum(1 for t in self.ledger.unsettled() if not t.parked)

    # -- copies awaiting the broker's confirm ------------------------------

    def publishable(self, token: int) -> bool:
        """May the copy a Republish asks for still be published (just before sending it)?

        Not when the original's channel has closed since the action was decided: the
        broker has requeued the original, which will be delivered and decided again,
        so a copy published now would be a duplicate (a second retry lineage, a second
        dead letter). Report such a token with `republished(token, ok=False)`.
        """
        return self.confirms.publishable(token)

    def republished(
        self, token: int, ok: bool, *, unroutable: bool = False, error: str | None = None
    ) -> list[Action]:
        """The broker confirmed (ok) or refused a Republish: settle the original.

        `unroutable`: the copy came back with basic.return (no queue bound): if
        the target is one of ackkit's own queues it is declared and the copy
        published once more. `error`: the copy could not be sent at all (the
        client library raised while encoding or publishing it; why, in words).

        A copy that failed is never retried forever (see `republish.Confirms._failed`):
        a broker nack of a healthy copy requeues the original a few times in a row; any
        other failure (or too many nacks) gets one minimal copy (body and ackkit's
        headers), and when that fails too the original is rejected without requeue.
        """
        return self.confirms.confirmed(token, ok, unroutable, error)

    # -- time and shutdown -------------------------------------------------

    def tick(self) -> list[Action]:
        """Call periodically (e.g. every 50 ms): sends acks held longer than the interval."""
        return self.ledger.tick()

    def drain(self) -> list[Action]:
        """Send every pending ack now (before basic.cancel and channel close)."""
        return self.ledger.drain()

    @property
    def pending_acks(self) -> int:
        return self.ledger.pending

    @property
    def outstanding(self) -> int:
        return self.ledger.outstanding()

    @property
    def republishing(self) -> int:
        return len(self.confirms)

    def unsettled(self) -> list[Tracked]:
        return self.ledger.unsettled()

    # -- internals ---------------------------------------------------------

    def _emit(self, stage: Stage, t: Tracked, reason: str, count: bool = True) -> None:
        if count:
            self.counters.counts[stage] += 1
        if self.observer and (self._hot or stage not in HOT_STAGES):
            ev = Event(stage, self.policy.name, t.tag, t.attempt, reason, t.message_id)
            self.observer(ev)

    def _ack(self, t: Tracked) -> list[Action]:
        self.counters.counts[Stage.ACKED] += 1
        if self._hot:
            self._emit(Stage.ACKED, t, "", count=False)
        return self.ledger.ack(t)

    def _ack_upto(self, tag: int) -> list[Action]:
        for x in self.ledger.ack_upto(tag):
            self._emit(Stage.ACKED, x, "")
        return self.ledger.flush_by_count()

    def _unsettled(self, t: Tracked) -> list[Action]:
        if self.mode is AckMode.CLIENT:
            # May be settled later by a multiple ack; only a full window is a problem.
            acts: list[Action] = []
            for x in self.ledger.park(t):
                acts.extend(self._apply_unsettled(x, "window full of unsettled deliveries"))
            return acts
        return self._apply_unsettled(t, "handler returned without settling")

    def _apply_unsettled(self, t: Tracked, why: str) -> list[Action]:
        self._emit(Stage.UNSETTLED, t, why)
        how = self.policy.on_unsettled
        if how is Unsettled.ACK:
            return self._ack(t)
        if how is Unsettled.REQUEUE:
            return self._requeue(t, why)
        return self._dead_letter(t, why, None, None)

    def _requeue(self, t: Tracked, why: str) -> list[Action]:
        self.ledger.gone(t)
        self._emit(Stage.REQUEUED, t, why)
        return [Reject(t.tag, requeue=True)]

    def _reject(self, t: Tracked, why: str) -> list[Action]:
        self.ledger.gone(t)
        self._emit(Stage.REJECTED, t, why)
        return [Reject(t.tag, requeue=False)]

    def _failure(self, t: Tracked, exc: BaseException, tb: str | None) -> list[Action]:
        """Carry out what `failure.decide` says `t`'s failure with `exc` becomes."""
        f = decide(self.policy, t.attempt, exc)
        fate = f.fate
        if fate is Fate.REQUEUE:
            return self._requeue(t, f.reason)
        if fate is Fate.REJECT:
            return self._reject(t, f.reason)
        if fate is Fate.DEAD_LETTER:
            return self._dead_letter(t, f.reason, exc, tb)
        if fate is Fate.LOST:
            self._emit(Stage.REJECTED, t, f.reason)
            return []
        self._emit(Stage.RETRYING, t, f.reason)
        if fate is Fate.RETRY_QUORUM:
            self.ledger.gone(t)
            return [Reject(t.tag, requeue=True)]  # counts: the queue delays it
        if fate is Fate.RETRY_IN_PROCESS:
            if t.first_failure is None:
                t.first_failure = CH.iso(self._wallclock())
            t.attempt += 1
            return [Reinvoke(t.tag, f.delay, t.attempt)]
        extra = self.extra_delay_queue(f.delay_ms / 1000) if f.asked else None
        hdrs = CH.retry_headers(t, exc, self._wallclock())
        act = self.confirms.issue(t, self.policy.delay_queue(f.delay_ms), hdrs, CopyPurpose.RETRY)
        if extra is not None:
            self._declared.add(extra.name)
            act = self.confirms.declaring(act, extra)
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
            return self._reject(t, reason)
        hdrs = CH.dead_letter_headers(t, self.policy, reason, exc, tb, self._wallclock(), attempts)
        self._emit(Stage.DEAD_LETTERED, t, reason, count=False)
        return [self.confirms.issue(t, dlq, hdrs, CopyPurpose.DEAD_LETTER)]

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
        hdrs = CH.restamp_headers(t)
        return self.confirms.issue(t, self.policy.queue, hdrs, CopyPurpose.RESTAMP)
