"""Copies awaiting the broker's confirm, and what their confirm or refusal settles.

Every retry, dead-letter and restamp copy is a `Republish` with a token; its
original stays unacked until the broker confirms the copy (then the original
is acked at once: until that ack is out, a lost connection leaves both). A
copy the broker refused, or the client could not send, is settled by a bounded
rule (`Confirms._failed`), never retried forever, and a copy the broker refused
never costs its original: it goes back to its queue (or, for a restamp copy,
runs without it), counted for that message alone, while the listener waits
(`gate.Flow.copy_refused`, FlowState.REFUSED) instead of spinning.

A restamp copy goes back to the queue its original came from, so the broker may
deliver it to this very consumer before the copy's confirm (and so the original's
ack) is out; a consumer killed in that window would leave the message twice in the
queue. With `hold=True` (the consumers) such a copy is held unstarted until its
original is settled, then started (`Start`).

"Settled" means processed by the broker, not handed to the client library: pika and
aiormq only queue a settle's frame, and a handler that kills its process before the
frame was written would leave the original unacked beside its copy (a twin: one more
run, one more dead letter). So a held copy starts after a `Fence` that follows the
original's settle, and a copy that arrives after its confirm, while that settle may
still be unwritten (`fencing`), starts after a Fence of its own.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from . import headers as H
from . import topology as _topology
from .actions import Ack, Action, CopyPurpose, Fence, Nack, Reject, Republish, Start
from .events import Counters, Stage
from .gate import Flow
from .ledger import Ledger
from .policy import AckMode, ListenerPolicy
from .tracked import Tracked

MAX_HELD = 10_000
"""Most restamp copies awaited at once (beyond it, a copy that arrives early just runs)."""

MAX_LOST_COPIES = 3
"""Times one message's copy is sent again after its publishing channel closed before the
broker answered (for another reason than a refusal), before its original goes back to
the queue (Confirms._failed)."""

NACKED = (
    "basic.nack from the broker (a queue at its length limit with overflow "
    "reject-publish, or a queue that cannot take it now)"
)
RETURNED = "returned by the broker (basic.return: no queue took it)"
REFUSALS = ("ACCESS_REFUSED", "AccessRefused", "(403", "403,", "RESOURCE_ERROR", "(506")
"""A channel closed with one of these refused the publish: not a chance loss."""

SETTLES = (Ack, Nack, Reject)
"""The actions that settle a delivery (a frame the broker must process before a copy
of it may start: see `Confirms.fencing`)."""

Emit = Callable[[Stage, Tracked, str], None]


class Confirms:
    """The copies of one listener that are published and not yet confirmed, by token."""

    def __init__(
        self,
        policy: ListenerPolicy,
        ledger: Ledger,
        counters: Counters,
        emit: Emit,
        *,
        hold: bool = False,
    ) -> None:
        self.policy = policy
        self.mode = policy.mode
        self._ledger = ledger
        self._counters = counters
        self._emit = emit
        self._originals: dict[int, Tracked] = {}
        self._acts: dict[int, Republish] = {}
        self._token = 0
        self.flow: Flow | None = None  # the listener's gate, told of refusals (set after)
        self.hold = hold
        # restamp id -> None while its copy is awaited, the copy once it arrived early
        self.held: dict[str, Tracked | None] = {}
        # restamp ids whose original's settle went to the runtime before its copy
        # arrived (until the copy arrives or the channel closes)
        self.fencing: dict[str, None] = {}

    def __len__(self) -> int:
        return len(self._originals)

    def issue(
        self, t: Tracked, queue: str, hdrs: dict[str, Any], purpose: CopyPurpose
    ) -> Republish:
        """A copy of `t` to `queue` with `hdrs` set (and `t`'s carried headers); `t` is
        settled (decided) until the copy's confirm arrives."""
        if t.carry:
            hdrs = {**t.carry, **hdrs}
        self._ledger.take(t)
        self._token += 1
        act = Republish(self._token, t.tag, "", queue, hdrs, purpose=purpose)
        self._originals[self._token] = t
        self._acts[self._token] = act
        if self.hold and purpose is CopyPurpose.RESTAMP and len(self.held) < MAX_HELD:
            self.held[hdrs[H.RESTAMP_ID]] = None
        return act

    def hold_early(self, t: Tracked, headers: Any) -> list[Action] | None:
        """Is `t` a restamp copy of ours whose original's settle is not out yet? [] when
        it is held (a later `confirmed` starts it); [Fence, Start] when that settle went
        to the runtime before `t` arrived (it may not have reached the broker yet);
        None: not such a copy."""
        rid = headers.get(H.RESTAMP_ID)
        if type(rid) is not str:
            return None
        if rid in self.fencing:
            del self.fencing[rid]
            return [Fence(), Start(t.tag)]
        if rid not in self.held or self.held[rid] is not None:
            return None
        self.held[rid] = t
        return []

    def channel_closed(self) -> None:
        """Whatever was sent on the closed channel has been processed or is gone: a copy
        arriving on the next one needs no fence."""
        self.fencing.clear()

    def take_held(self) -> list[Tracked]:
        """Shutdown: the copies held unstarted (they go back to the queue)."""
        out = [t for t in self.held.values() if t is not None]
        self.held = dict.fromkeys(self.held)
        return out

    def declaring(self, act: Republish, spec: _topology.QueueSpec) -> Republish:
        """`act` (just issued), declaring the queue `spec` before it is published."""
        act = dataclasses.replace(act, declare=(spec.name, spec.arguments))
        self._acts[act.token] = act
        return act

    def publishable(self, token: int) -> bool:
        """See ListenerCore.publishable."""
        t = self._originals.get(token)
        if t is None:
            return False
        if self.mode is AckMode.NONE:
            return True  # the broker forgot the original on send: the copy is all there is
        return self._ledger.current(t)

    def confirmed(
        self,
        token: int,
        ok: bool,
        unroutable: bool,
        error: str | None,
        lost: str | None = None,
    ) -> list[Action]:
        """See ListenerCore.republished."""
        act = self._acts.get(token)
        acts = self._confirmed(token, ok, unroutable, error, lost)
        if act is None or not self.held or act.purpose is not CopyPurpose.RESTAMP:
            return acts
        rid = str(act.set_headers.get(H.RESTAMP_ID))
        if any(a.set_headers.get(H.RESTAMP_ID) == rid for a in self._acts.values()):
            return acts  # sent once more: still awaited
        early = self.held.pop(rid, None)
        if early is None:
            if any(type(a) in SETTLES for a in acts):  # the copy may arrive before it is out
                if len(self.fencing) >= MAX_HELD:
                    del self.fencing[next(iter(self.fencing))]
                self.fencing[rid] = None
            return acts
        if early.settled or not self._ledger.current(early):
            return acts
        # after the broker has processed the original's settle (not only the client)
        return [*acts, Fence(), Start(early.tag)]

    def _confirmed(
        self, token: int, ok: bool, unroutable: bool, error: str | None, lost: str | None
    ) -> list[Action]:
        t = self._originals.pop(token, None)
        act = self._acts.pop(token, None)
        if t is None:
            return []
        if ok and act is not None:
            self._accepted(t, act)
        ledger = self._ledger
        if t.generation != ledger.generation and self.mode is AckMode.NONE:
            return []
        if not ledger.current(t):
            self._emit(Stage.DROPPED_STALE, t, "channel closed before the republish confirm")
            return []
        if not ok and unroutable and act is not None:
            again = self._declaring_again(t, act)
            if again is not None:
                return [again]
        if self.mode is AckMode.NONE:
            if not ok:
                why = error or lost or (RETURNED if unroutable else NACKED)
                self._emit(Stage.REJECTED, t, f"lost: no-ack delivery and its copy failed: {why}")
                if error is None and act is not None and self.flow is not None:
                    self.flow.copy_refused(act.routing_key, why)  # lose no more meanwhile
            return []
        if not ok:
            return self._failed(t, act, unroutable, error, lost)
        if self.mode is AckMode.TRANSACTED:
            return ledger.ack(t)
        return ledger.ack_now(t)

    def _accepted(self, t: Tracked, act: Republish) -> None:
        """The broker confirmed `act`: a dead letter counts now (it is in the queue), and a
        destination that refused copies takes them again."""
        if act.purpose is CopyPurpose.DEAD_LETTER:
            self._emit(Stage.DEAD_LETTERED, t, str(act.set_headers.get(H.REASON, "")))
        if self.flow is not None:
            self.flow.copy_accepted(act.routing_key)

    def _failed(
        self,
        t: Tracked,
        act: Republish | None,
        unroutable: bool,
        error: str | None,
        lost: str | None,
    ) -> list[Action]:
        """The bounded rule for a copy that was not published. Per message, never a budget
        shared with the listener's other messages:

        1. The channel it went out on closed before the broker answered, for another
           reason than a refusal (another publish's error, a connection cut): the same
           copy once more (the original stays unsettled), up to MAX_LOST_COPIES times
           for this message; then as 2.
        2. The broker refused it (basic.nack, e.g. a full queue with reject-publish; a
           return although its queue was just declared; a 403 channel close): never the
           original's loss. A restamp copy (its own queue is full): the original runs
           now without it (`Start`, consumers) at the attempt it has. Any other: the
           original goes back to its queue (its redelivery is not an attempt) and the
           listener waits a while before it consumes again (`Flow.copy_refused`).
        3. The client could not build or send it (`error`): one more copy, minimal (the
           body and ackkit's headers), to the same queue; when that cannot be built
           either (frame_max too small for ackkit's headers), the original is rejected
           without requeue (the queue's own dead-letter exchange takes it, if any).
        """
        if error is None and act is not None:
            if lost is not None and not refused(lost) and t.lost_copies < MAX_LOST_COPIES:
                t.lost_copies += 1
                return [self._again(t, act)]
            why = lost if lost is not None else RETURNED if unroutable else NACKED
            return self._refused(t, act, why)
        why = error or NACKED
        if act is not None and not act.minimal:
            hdrs = {**act.set_headers, H.COPY_NOTE: f"minimal copy: the full copy failed: {why}"}
            return [self._again(t, act, minimal=True, set_headers=hdrs)]
        purpose = act.purpose if act is not None else "republished"
        self._ledger.window.mark_gone(t.tag)
        self._emit(
            Stage.REJECTED,
            t,
            f"{purpose} copy could not be published ({why}), not even a minimal one",
        )
        return [Reject(t.tag, requeue=False)]

    def _refused(self, t: Tracked, act: Republish, why: str) -> list[Action]:
        """The broker refused `act`, a copy of `t` (rule 2 of `_failed`)."""
        where = f"{act.purpose} copy to {act.routing_key!r} refused: {why}"
        early = self.held.get(str(act.set_headers.get(H.RESTAMP_ID)))
        if act.purpose is CopyPurpose.RESTAMP and self.hold and early is None:
            # Its own queue is full: requeueing would bring it straight back for another
            # restamp; it runs now, with the attempt number the copy was to carry. (When
            # the copy arrived all the same, that one runs: `confirmed` starts it.)
            self._ledger.untake(t)
            self._emit(Stage.COPY_REFUSED, t, f"{where}; the message runs without it")
            return [Start(t.tag)]
        self._ledger.window.mark_gone(t.tag)
        self._emit(Stage.COPY_REFUSED, t, f"{where}; the message goes back to its queue")
        self._emit(Stage.REQUEUED, t, f"{act.purpose} copy refused by the broker")
        if self.flow is not None:
            self.flow.owe(t.message_id)  # its redelivery is not an attempt
            if act.purpose is not CopyPurpose.RESTAMP:
                self.flow.copy_refused(act.routing_key, why)
        return [Reject(t.tag, requeue=True)]

    def _declaring_again(self, t: Tracked, act: Republish) -> Republish | None:
        """A refused copy to one of our own queues: publish it once more, declaring the
        queue first. The usual cause is the queue having been deleted while we run
        (every copy comes back unroutable); requeueing the original would then loop
        through the handler as fast as the broker can redeliver."""
        if act.declare is not None:
            return None  # declared and still refused: requeue
        spec = _topology.own_queue(self.policy, act.routing_key)
        if spec is None:
            return None
        return self._again(t, act, declare=(spec.name, spec.arguments))

    def _again(self, t: Tracked, act: Republish, **changes: Any) -> Republish:
        """`act` once more, under a new token, with `changes`."""
        self._token += 1
        again = dataclasses.replace(
            act, token=self._token, again_of=act.again_of or act.token, **changes
        )
        self._originals[self._token] = t
        self._acts[self._token] = again
        return again


def refused(why: str) -> bool:
    """Does the text of a channel's close say the broker refused what was published on it
    (403 ACCESS_REFUSED, 506 RESOURCE_ERROR)?"""
    return any(r in why for r in REFUSALS)
