"""Starting handlers, and stopping: the part of `ListenerCore` a shutdown runs through.

`Shutdown` (`ListenerCore.shutdown`) is handed the listener's `parts.Parts`, and
the parts whose deliveries it starts or returns: the
fates (a doomed delivery's dead letter), the lost runs (a suspect's charged
copy) and the gating (a key a delivery leaves in the flow gate).

A runtime asks `begin(ts)` just before a handler runs (`start(t)` per
delivery), `resume(rerun)` when an in-process retry's wait is over, and
`release(t)` for a delivery whose handler never ran to the end. A stopping
core (`hold()` as the stop begins, `stop()` once its consumer is cancelled)
starts nothing from then on: deliveries go back to their queue, retries
waiting in process too (see also `outcome.handled`), and `quiescent` says when
it waits for nothing more. Until `stop()` what goes back is held: returned
while the consumer still consumes, a copy could be delivered straight back to
it. Each runtime's stop carries
that out phase by phase, in the one order `ackkit._interpreter.stopping` gives.

An unstarted delivery goes back as a copy that keeps its attempt, and its
original is acked once the broker confirms the copy. A copy whose confirm the
stop no longer waits for may be in the queue all the same, next to its
original requeued when the connection closes: the message twice. So a
stopping core has at most `STOP_COPIES` copies awaiting their confirm; the
other unstarted deliveries wait their turn (each confirm sends the next), and
those still waiting when the stop has no time left go back as they are
(`give_back`).
"""

from __future__ import annotations

import uuid
from collections import deque
from collections.abc import Sequence

from . import copies
from . import outcome as _outcome
from .actions import Action, CopyPurpose, Nack, Republish, TxCommit
from .events import Stage
from .fates import Fates
from .gating import Gating
from .lost import LostRuns
from .parts import Part, Parts
from .policy import AckMode
from .step import Step
from .tracked import Tracked

STOP_COPIES = 256
"""Most copies a listener awaits the broker's confirm for while it returns unstarted
deliveries (a few round trips' worth: the rest of the stop still fits them all in)."""
LAST_COPIES = 0.3
"""Seconds at the end of a stop's wait for copies kept for the copies in flight alone:
from then on no unstarted delivery goes back as a copy (`give_back`)."""


class Shutdown(Part):
    """Start and stop decisions of one listener."""

    def __init__(self, parts: Parts, fates: Fates, lost: LostRuns, gating: Gating) -> None:
        super().__init__(parts)
        self._fates = fates
        self._lost = lost
        self._gating = gating
        self.stopping = False
        """The app is stopping (`stop()`): no handler starts, no retry runs again."""
        self._returning: deque[Tracked] = deque()
        """Unstarted deliveries waiting for their turn to go back as a copy (`release`)."""
        self._given_back = False
        """The stop has no time left for copies (`give_back`): no more are sent."""
        self._holding = False
        """Stopping, the consumer not cancelled yet (`hold`): nothing goes back yet."""
        self.returns_free = False
        """The broker counts no attempt for a return that says it never failed (AMQP 1.0's
        `released`, where attempts are the header's delivery-count): an unstarted
        delivery goes back as it is, without a copy (`ListenerCore.use_broker` sets it)."""

    def startable(self, t: Tracked) -> bool:
        """May a handler start on `t` now (called just before)? Not when its channel closed
        since it was delivered: the broker has requeued it, so running the handler would
        only duplicate the work its redelivery will do (and delay that redelivery)."""
        if self.mode is AckMode.NONE:
            return True  # the broker forgot it on send: this is the only chance
        if t.settled:
            return False
        if not self._ledger.current(t):
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
        if not self.startable(t):
            return self._gating.leave(t)
        if t.doomed is not None:  # an inbox listener's, its key not recorded (`look_up_first`)
            why, attempts = t.doomed
            return [*self._fates.dead_letter(t, why, None, None, attempts), *self._gating.leave(t)]
        if t.lost is not None:  # a redelivery that may have been lost: run on a copy
            copy = self._lost.run_lost(t)
            if copy is not None:
                # the copy runs instead, and takes its serial key anew when it arrives
                return [copy, *self._gating.leave(t)]
            # `tick` starts it once the last charged run is done (through the flow gate
            # again: meanwhile its serial key goes on, or the charged copy it waits for
            # could wait behind it for that key)
            return self._gating.leave(t)
        return None

    def begin(self, ts: Sequence[Tracked], *, waited: bool = False) -> Step:
        """A worker is about to run the handler for `ts`: which of them run (`Step.run`),
        after how long a wait for the rate limit (`Step.delay`), and the actions for the
        others (see `start`; the flow gate returns those it no longer lets start).
        `waited`: asked again after the rate limit's wait (it is not booked twice)."""
        gating = self._gating
        if len(ts) == 1:  # the common case, without the lists
            t = ts[0]
            led = self._ledger
            flow = gating.flow
            if (
                not self.stopping
                and t.doomed is None
                and t.lost is None
                and not t.settled
                and t.generation == led.generation
                and led.open
                and not (gating.gated and (flow.gated or flow.bucket is not None))
            ):  # it starts, nothing to decide (what `start` and the gate come to)
                return Step(led.generation, None, ts)
            if not gating.gated:
                a = self.start(t)
                return Step(led.generation, None, ts) if a is None else Step(led.generation, a)
        go, acts = self._startable(ts)
        flow = gating.flow
        if go and gating.gated and (flow.gated or flow.bucket is not None):
            out = gating.start(go, acts, waited)
            if out.delay <= 0:
                flow.started(out.run)
            return out
        return Step(self._ledger.generation, acts, go)

    def resume(self, rerun: Sequence[Tracked]) -> Step:
        """The wait before running a handler again for `rerun` (in-process retry) is over,
        or was cut short because the app stops: which of them run again now
        (`Step.run`), and the actions for the others (released when stopping)."""
        go, acts = self._startable(rerun)
        return Step(self._ledger.generation, acts, go)

    def _startable(self, ts: Sequence[Tracked]) -> tuple[list[Tracked], list[Action]]:
        """`start` for each of `ts`: those that go ahead, and the others' actions."""
        acts: list[Action] = []
        go: list[Tracked] = []
        for t in ts:
            a = self.start(t)
            if a is None:
                go.append(t)
            else:
                acts.extend(a)
        return go, acts

    def release(self, t: Tracked, *, started: bool = False) -> list[Action]:
        """Return a delivery whose handler never ran (shutdown), or never ran to the end
        (`started`: its task was cancelled at the shutdown timeout).

        A started one goes back with basic.nack requeue: its run counts as an attempt.
        An unstarted one costs no attempt. Where the broker counts no return that says
        so (`returns_free`: AMQP 1.0's `released`), it goes back as it is. Else the
        broker counts every return (the redelivered flag on classic queues,
        x-delivery-count on quorum queues before 4.3, x-acquired-count on 4.3), so a
        copy carrying the attempt it had (and its crash count) goes back to its queue
        instead, and the original is acked once the copy is confirmed: its next delivery
        runs as the attempt it would have run as now. The copy joins the back of the
        queue.
        """
        leave = self._gating.leave(t)  # it will not run (again) here: its key goes on
        if t.settled or not self._ledger.current(t):
            return leave
        if started or self.mode is AckMode.NONE:
            self._ledger.gone(t)
            self._emit(Stage.RETURNED, t, "handler cancelled at shutdown")
            return [Nack(t.tag, requeue=True), *leave]  # its run counts
        if self._given_back or self.returns_free:
            return [*self._as_it_is([t]), *leave]
        if self._holding or len(self._confirms) >= STOP_COPIES:
            self._returning.append(t)  # its turn comes with `stop`, or a confirm
            return leave
        return [self._copy_back(t), *leave]

    def release_all(self, ts: Sequence[Tracked], *, started: bool = False) -> Step:
        """`release(t, started=started)` for each of `ts`, in order."""
        acts: list[Action] = []
        for t in ts:
            acts.extend(self.release(t, started=started))
        return Step(self._ledger.generation, acts)

    def _copy_back(self, t: Tracked) -> Republish:
        """The copy that returns unstarted `t` keeping its attempt (its original is acked
        once the copy is confirmed)."""
        self._emit(Stage.RETURNED, t, f"shutdown before start: attempt {t.attempt} kept on a copy")
        hdrs = copies.restamp_headers(t, uuid.uuid4().hex)
        return self._confirms.issue(t, self.policy.queue, hdrs, CopyPurpose.RESTAMP)

    def return_next(self) -> list[Action]:
        """A copy was answered: the copies of the unstarted deliveries waiting their turn,
        as far as `STOP_COPIES` allows (called from `republished`)."""
        acts: list[Action] = []
        if self._holding:
            return acts
        waiting = self._returning
        while waiting and len(self._confirms) < STOP_COPIES:
            t = waiting.popleft()
            if not t.settled and self._ledger.current(t):
                acts.append(self._copy_back(t))
        return acts

    def give_back(self) -> Step:
        """The stop has no time left to wait for more copies (call before its last wait
        for the copies in flight): the unstarted deliveries still waiting for one go back
        to their queue as they are, with basic.nack requeue. The broker counts that
        return (they lose the attempt a copy would have kept); a copy sent now could be
        in the queue unconfirmed next to its requeued original (twice)."""
        self._given_back = True
        waiting, self._returning = self._returning, deque()
        return Step(self._ledger.generation, self._as_it_is(waiting))

    def _as_it_is(self, ts: Sequence[Tracked]) -> list[Action]:
        """Unstarted `ts` back to their queue without a copy (`give_back`, or
        `returns_free`)."""
        acts: list[Action] = []
        why = (
            "shutdown before start: released, no attempt counted"
            if self.returns_free
            else "shutdown before start: no time left for a copy"
        )
        for t in ts:
            if t.settled or not self._ledger.current(t):
                continue
            self._ledger.gone(t)
            self._emit(Stage.RETURNED, t, why)
            acts.append(Nack(t.tag, requeue=True, counts=False))
        if acts and self.mode is AckMode.TRANSACTED:
            acts.append(TxCommit())
        return acts

    def hold(self) -> None:
        """A stop begins and the consumer is not cancelled yet: from now on no handler
        starts and no retry runs again, as after `stop()`, but what would have is held
        (`release`) until `stop()`: a copy sent now could be delivered straight back."""
        self.stopping = True
        self._holding = True

    def stop(self) -> Step:
        """The app stops (call once its consumer is cancelled: `ackkit._interpreter.stopping`
        has the order): from now on no handler starts (`start` releases the delivery),
        and a delivery waiting to be retried in process is released instead (`handled`,
        `resume`). Returns the acks held back and the copies of what `hold` kept, to
        send now."""
        self.stopping = True
        self._holding = False
        return Step(self._ledger.generation, [*self._ledger.drain(), *self.return_next()])

    def interrupted(self, fact: _outcome.Interruption) -> bool:
        """A cancellation reached a running handler: True to release its deliveries
        (`release(t, started=True)`), False to report it to `handled` as a failure."""
        return _outcome.released(fact)

    def take_held(self) -> list[Tracked]:
        """Shutdown: deliveries held unstarted by `receive` or `start`, and those the flow
        gate holds (return them)."""
        waiting = self._lost.take_waiting()
        return self._gating.take_held() + self._confirms.take_held() + waiting

    def channel_closed(self) -> None:
        """The channel is gone: the unstarted deliveries waiting to go back as copies
        went back with it (the broker requeued them)."""
        self._returning.clear()

    @property
    def quiescent(self) -> bool:
        """Stopping, and the core waits for nothing more: no copy awaits the broker's
        confirm and no ack is held back (or the channel is gone, and with it every
        tag). A handler still running past the shutdown timeout does not count: its
        delivery is the broker's to requeue when the channel closes."""
        if not self.stopping:
            return False
        if not self._ledger.open:
            return True
        return not self._confirms and self._ledger.pending == 0 and not self._returning

    @property
    def copies_in_flight(self) -> bool:
        """Copies sent on a channel still open, their confirm not yet in: closing now could
        leave one routed next to its original, requeued by the close (`may_close`)."""
        return self._ledger.open and bool(self._confirms)

    @property
    def busy(self) -> int:
        """Deliveries received and not decided yet (queued for, or in, a handler)."""
        return sum(1 for t in self._ledger.unsettled() if not t.parked)
