"""Copies awaiting the broker's confirm, and what their confirm or refusal settles.

Every retry, dead-letter and restamp copy is a `Republish` with a token; its
original stays unacked until the broker confirms the copy (then the original
is acked at once: until that ack is out, a lost connection leaves both). A
copy the broker refused, or the client could not send, is settled by a bounded
rule (`Confirms._failed`), never retried forever.

A restamp copy goes back to the queue its original came from, so the broker may
deliver it to this very consumer before the copy's confirm (and so the original's
ack) is out; a consumer killed in that window would leave the message twice in the
queue. With `hold=True` (the consumers) such a copy is held unstarted until its
original is settled, then started (`Start`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from . import headers as H
from . import topology as _topology
from .actions import Action, CopyPurpose, Reject, Republish, Start
from .events import Counters, Stage
from .ledger import Ledger
from .policy import AckMode, ListenerPolicy
from .tracked import Tracked

MAX_HELD = 10_000
"""Most restamp copies awaited at once (beyond it, a copy that arrives early just runs)."""

MAX_NACKS_IN_ROW = 3
"""Copies in a row the broker may nack (each requeueing its original) before a failed
copy is replaced by a minimal one and then the original rejected (Confirms._failed)."""

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
        self._nacked_in_row = 0
        self.hold = hold
        # restamp id -> None while its copy is awaited, the copy once it arrived early
        self.held: dict[str, Tracked | None] = {}

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
        if purpose is CopyPurpose.DEAD_LETTER:
            self._counters.counts[Stage.DEAD_LETTERED] += 1
        self._token += 1
        act = Republish(self._token, t.tag, "", queue, hdrs, purpose=purpose, source=t.payload)
        self._originals[self._token] = t
        self._acts[self._token] = act
        if self.hold and purpose is CopyPurpose.RESTAMP and len(self.held) < MAX_HELD:
            self.held[hdrs[H.RESTAMP_ID]] = None
        return act

    def hold_early(self, t: Tracked, headers: Any) -> bool:
        """Is `t` a restamp copy of ours whose original's ack is not out yet? Then it is
        held (a later `confirmed` starts it)."""
        rid = headers.get(H.RESTAMP_ID)
        if type(rid) is not str or rid not in self.held or self.held[rid] is not None:
            return False
        self.held[rid] = t
        return True

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

    def confirmed(self, token: int, ok: bool, unroutable: bool, error: str | None) -> list[Action]:
        """See ListenerCore.republished."""
        act = self._acts.get(token)
        acts = self._confirmed(token, ok, unroutable, error)
        if act is None or not self.held or act.purpose is not CopyPurpose.RESTAMP:
            return acts
        rid = str(act.set_headers.get(H.RESTAMP_ID))
        if any(a.set_headers.get(H.RESTAMP_ID) == rid for a in self._acts.values()):
            return acts  # sent once more: still awaited
        early = self.held.pop(rid, None)
        if early is None or early.settled or not self._ledger.current(early):
            return acts
        return [*acts, Start(early)]  # after the original's settle

    def _confirmed(self, token: int, ok: bool, unroutable: bool, error: str | None) -> list[Action]:
        t = self._originals.pop(token, None)
        act = self._acts.pop(token, None)
        if t is None:
            return []
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
                self._emit(Stage.REJECTED, t, "lost: no-ack delivery and the DLQ publish failed")
            return []
        if not ok:
            return self._failed(t, act, unroutable, error)
        self._nacked_in_row = 0
        if self.mode is AckMode.TRANSACTED:
            return ledger.ack(t)
        return ledger.ack_now(t)

    def _failed(
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
                self._ledger.window.mark_gone(t.tag)
                self._emit(Stage.REQUEUED, t, f"copy {why}")
                return [Reject(t.tag, requeue=True)]
        else:
            why = error
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
        again = dataclasses.replace(act, token=self._token, source=t.payload, **changes)
        self._originals[self._token] = t
        self._acts[self._token] = again
        return again
