"""How a delivery ends: the core's settling moves, shared by every decision.

`Fates` is a part of `ListenerCore`: a handler's end (`finish`,
`finish_batch`), a handler's own settle (`settle`), ack now or with the next
multiple-ack, requeue, reject, the default for a handler that left its
delivery unsettled, what a failure becomes (`failure.decide` carried out:
requeue, retry in process, a retry copy in a delay queue, a dead letter), and
the copies a delivery can leave behind (dead letter, restamp). Each returns
the actions a runtime carries out, and counts and reports what it did.

It is handed the listener's `parts.Parts` (it tells every explicit requeue to
their `Requeues`, and stamps the copies' headers with their wall clock) and the
queues (which of its own queues a copy declares first).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from . import copies
from .actions import Action, CopyPurpose, Nack, Reinvoke, Reject, Republish, SettleKind
from .errors import AlreadySettled, RetryLater, SettleNotAllowed
from .events import Stage
from .failure import Fate, decide
from .parts import Part, Parts
from .policy import AckMode, Unsettled
from .topology import Queues
from .tracked import Tracked

_BATCHED = (AckMode.AUTO, AckMode.DUPS_OK, AckMode.TRANSACTED)


class Fates(Part):
    """The settling moves of one listener."""

    def __init__(self, parts: Parts, queues: Queues) -> None:
        super().__init__(parts)
        self._queues = queues
        self._requeues = parts.requeues
        self._wallclock = parts.wallclock

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
        led = self._ledger
        if t.generation != led.generation or not led.open:  # `Ledger.current`, inline
            t.settled = True
            self._emit(Stage.DROPPED_STALE, t, "channel closed")
            return []
        if exc is None:
            if self.mode in _BATCHED:
                return self._ack(t)
            return self._unsettled(t)
        if self.mode is AckMode.TRANSACTED:
            # The transaction rolls back: its pending acks become requeues.
            return self._ledger.requeue_pending() + self._failure(t, exc, traceback)
        return self._failure(t, exc, traceback)

    def finish_all(self, ts: Sequence[Tracked]) -> list[Action]:
        """`finish(t)` for each of `ts` in order, each handled with success (a batch
        consumer's written batch): the same decisions, with less work per delivery when
        acks go out in batches and no observer wants each one."""
        if self.mode not in _BATCHED or self._report.hot:
            out: list[Action] = []
            for t in ts:
                out.extend(self.finish(t))
            return out
        led = self._ledger
        acts, n = led.ack_each(ts, stale=self.finish)
        self._report.counters.counts[Stage.ACKED] += n
        return acts

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
        ledger = self._ledger
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
                self._requeues.owe(x)
                self._emit(Stage.REQUEUED, x, f"{how} requeue by handler")
            return acts
        for x in targets:
            x.settled = False  # _dead_letter settles it
            acts.extend(self.dead_letter(x, f"{how} without requeue by handler", None, None))
        return acts

    def _ack(self, t: Tracked) -> list[Action]:
        self._report.counters.counts[Stage.ACKED] += 1
        if self._report.hot:
            self._emit(Stage.ACKED, t, "", count=False)
        return self._ledger.ack(t)

    def _ack_upto(self, tag: int) -> list[Action]:
        for x in self._ledger.ack_upto(tag):
            self._emit(Stage.ACKED, x, "")
        return self._ledger.flush_by_count()

    def _unsettled(self, t: Tracked) -> list[Action]:
        if self.mode is AckMode.CLIENT:
            # May be settled later by a multiple ack; only a full window is a problem.
            acts: list[Action] = []
            for x in self._ledger.park(t):
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
        return self.dead_letter(t, why, None, None)

    def _requeue(self, t: Tracked, why: str) -> list[Action]:
        self._requeues.owe(t)
        self._ledger.gone(t)
        self._emit(Stage.REQUEUED, t, why)
        return [Reject(t.tag, requeue=True)]

    def _reject(self, t: Tracked, why: str) -> list[Action]:
        self._ledger.gone(t)
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
            return self.dead_letter(t, f.reason, exc, tb)
        if fate is Fate.LOST:
            self._emit(Stage.REJECTED, t, f.reason)
            return []
        self._emit(Stage.RETRYING, t, f.reason)
        if fate is Fate.RETRY_QUORUM:
            self._ledger.gone(t)
            return [Reject(t.tag, requeue=True)]  # counts: the queue delays it
        if fate is Fate.RETRY_IN_PROCESS:
            if t.first_failure is None:
                t.first_failure = copies.iso(self._wallclock())
            t.attempt += 1
            t.again = Reinvoke(t.tag, f.delay, t.attempt)  # `outcome.handled` reruns it
            return []
        hdrs = copies.retry_headers(t, exc, self._wallclock())
        act = self._confirms.issue(t, self.policy.delay_queue(f.delay_ms), hdrs, CopyPurpose.RETRY)
        if f.asked:
            act = self._queues.asked_delay(act, f.delay_ms / 1000)
        return [self._queues.on_use(act)]

    def dead_letter(
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
        hdrs = copies.dead_letter_headers(
            t, self.policy, reason, exc, tb, self._wallclock(), attempts
        )
        # counted and reported (Stage.DEAD_LETTERED) once the broker confirms the copy
        return [self._queues.on_use(self._confirms.issue(t, dlq, hdrs, CopyPurpose.DEAD_LETTER))]

    def restamp(self, t: Tracked) -> Republish:
        """A redelivery from a queue that does not count deliveries goes back to its
        queue as a copy carrying its attempt number (then the original is acked).

        A classic queue's redelivered flag says "delivered before", not how often:
        without this, a message that kills its consumer (or holds it past the
        broker's consumer_timeout) every time would come back as attempt 2 forever.
        The copy starts at this attempt, so every further loss counts once more and
        the message reaches max_attempts and the DLQ instead of looping.
        """
        self._emit(Stage.REQUEUED, t, f"redelivered: attempt {t.attempt} stamped on a copy")
        hdrs = copies.restamp_headers(t, uuid.uuid4().hex)
        return self._confirms.issue(t, self.policy.queue, hdrs, CopyPurpose.RESTAMP)

    def unreadable(self, t: Tracked, why: str) -> list[Action]:
        reason = f"unreadable message: {why}"
        if self.policy.dead_letter_queue is None and self.mode is AckMode.NONE:
            self._emit(Stage.REJECTED, t, f"lost (no-ack, no DLQ): {reason}")
            t.settled = True
            return []
        return self.dead_letter(t, reason, None, None)
