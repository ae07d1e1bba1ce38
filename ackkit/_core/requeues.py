"""The explicit requeues of this process: no lost runs when they come back.

`Requeues` is shared by two parts of `ListenerCore`: the fates (`fates.Fates`),
which make an explicit requeue (the handler's, or RequeueMessage) and tell it
here (`owe`), and the lost runs (`lost.LostRuns`), which forgive the redelivery
of such a message (`forgive`) instead of counting it as a run lost with its
consumer.
"""

from __future__ import annotations

from .policy import ListenerPolicy
from .tracked import Tracked

MAX_REQUEUED = 100_000
"""Explicit requeues remembered per listener (see `Requeues.owe`); oldest first out."""


class Requeues:
    """The explicit requeues of this process, by message (see `owe`): shared by the
    fates, which make them, and the lost runs, which forgive their redeliveries."""

    def __init__(self, policy: ListenerPolicy) -> None:
        self.policy = policy
        self._requeued: dict[str, int] = {}

    def owe(self, t: Tracked) -> None:
        """`t` goes back to its queue by an explicit requeue (the handler's, or
        RequeueMessage): its redelivery here is no lost run (see `LostRuns.lost_run`).
        Only this process knows: a redelivery to another consumer counts as one."""
        if self.policy.retry.max_attempts > 1:
            return  # attempts bound a redelivery there
        key = t.message_id or f"\0{t.exchange}\0{t.routing_key}"
        r = self._requeued
        r[key] = r.pop(key, 0) + 1
        if len(r) > MAX_REQUEUED:
            del r[next(iter(r))]

    def forgive(self, t: Tracked) -> bool:
        """Is redelivered `t` one we requeued explicitly (see `owe`)?"""
        r = self._requeued
        if not r:
            return False
        key = t.message_id or f"\0{t.exchange}\0{t.routing_key}"
        n = r.pop(key, 0)
        if n > 1:
            r[key] = n - 1
        return n > 0
