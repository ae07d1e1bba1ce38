"""Lost handler runs: what bounds a crash loop when attempts do not (max_attempts=1).

A redelivery says its last delivery was lost (the consumer died or disconnected),
not whether its handler was running then. `ListenerCore.receive` asks `lost_run`:
a redelivery this listener did not requeue itself is a suspect (`Tracked.lost`),
dead-lettered once its message lost LOST_BOUND runs (`ackkit-lost`). Otherwise
`Shutdown.start` runs it on a copy charged with one more lost run, made just before
the run (`run_lost`), one charged run at a time (`slot_free`): other suspects
wait (`start_waiting`, from `tick`), so that deliveries prefetched behind a message
that kills the process are not charged with it. Explicit requeues of this process
(`Requeues.owe`, told by `Fates`) are no lost runs: they loop as RabbitMQ does.

An inbox listener (`dedup`) counts only runs lost before their transaction committed:
a redelivery whose key the inbox recorded was done, only its ack was lost, so it is a
duplicate to ack, never a crash loop (nor an exhausted message). Its runtime looks the
key up before `start` charges the run or dead-letters the message (`look_up_first`):
found, it acks the duplicate; not found, `start` decides as for any listener.

`LostRuns` is a part of `ListenerCore`, handed the listener's `parts.Parts` (the
confirms carry its charged copies; it forgives what their `Requeues` were told
by the fates), the fates (for a dead letter), and whether it is an inbox's.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from . import copies
from . import headers as H
from .actions import Action, CopyPurpose, Republish, Start
from .events import Stage
from .fates import Fates
from .parts import Part, Parts
from .tracked import Tracked

CHARGE_WAIT = 10.0
"""Seconds a suspect waits at most for the charged copy before it (see `slot_free`)."""


class LostRuns(Part):
    """The lost-run state of one listener."""

    def __init__(self, parts: Parts, fates: Fates, dedup: bool = False) -> None:
        super().__init__(parts)
        self._fates = fates
        self._requeues = parts.requeues
        self._clock = parts.clock
        self.dedup = dedup
        """The runtime records the keys of committed runs (an inbox listener): see
        `look_up_first`."""
        self.charging: str | None = None
        """The restamp id of the copy a charged run waits for (see `run_lost`)."""
        self._charged: Tracked | None = None  # that copy, once it arrived
        self._charged_at = 0.0
        self._waiting: list[Tracked] = []  # suspects waiting for the charge slot

    def arrived(self, t: Tracked, headers: Mapping[str, Any] | None) -> None:
        """`t` was delivered: if it is the charged copy, back at this consumer, the slot
        frees once it is settled."""
        if self.charging is not None and headers and headers.get(H.RESTAMP_ID) == self.charging:
            self.charging, self._charged = None, t

    def lost_run(
        self, t: Tracked, headers: Mapping[str, Any] | None, wire: Mapping[str, Any] | None
    ) -> int | None:
        """A redelivery with max_attempts=1 that this listener did not requeue itself: its
        last delivery was lost (the consumer died or disconnected, maybe while the
        handler ran). Past LOST_BOUND lost runs it is dead-lettered (`t.verdict`); else
        `t.lost` makes `start` run its handler on a copy counting one more. None: an
        explicit requeue of ours, redelivered as RabbitMQ does (loops if it must)."""
        if self._requeues.forgive(t):
            return None
        lost = H.lost_of(headers, wire)
        if lost >= H.LOST_BOUND:
            why = f"consumer died or lost its connection {lost} times while handling it"
            self.doom(t, why)
        else:
            t.lost = lost
        return lost

    def doom(self, t: Tracked, why: str, attempts: int | None = None) -> None:
        """A redelivery that ends in the dead-letter queue unrun: at once (`t.verdict`),
        or for a `dedup` listener at `start`, once its runtime found its key unrecorded
        (`look_up_first`)."""
        if self.dedup:
            t.doomed = (why, attempts)
        else:
            t.verdict = self._fates.dead_letter(t, why, None, None, attempts)

    def look_up_first(self, t: Tracked) -> bool:
        """Must the runtime of a `dedup` listener look `t`'s key up in its record before
        it asks `start`? Yes for a redelivery ackkit would not simply run: one to run on
        a charged copy (`t.lost`) or to dead-letter (`t.doomed`, past the crash-loop
        bound or its attempts). A key recorded means its last run committed and only
        the ack was lost: the runtime acks it as a duplicate (`duplicate`,
        then finished as a handler that returned), neither charged nor dead-lettered:
        the bound counts only runs lost before their commit. No key recorded (or none
        to look up): `start` charges the run or dead-letters the message, as for any
        listener, so a message that kills its consumer before it commits stays bounded."""
        return self.dedup and not t.settled and (t.lost is not None or t.doomed is not None)

    def duplicate(self, t: Tracked, key: str) -> None:
        """An inbox listener found `t`'s key recorded already: counted and told (the
        runtime then finishes it as done, without running the handler)."""
        self._emit(Stage.DUPLICATE, t, f"inbox key {key!r} already recorded")

    def run_lost(self, t: Tracked) -> Republish | None:
        """`start` of a suspect (`t.lost`): the charged copy to run on instead, when the
        slot is free (`slot_free`); else None, and `t` waits for it (`start_waiting`)."""
        if self.slot_free():
            return self._charge_lost(t)
        self._waiting.append(t)
        return None

    def _charge_lost(self, t: Tracked) -> Republish:
        """Before a handler runs on a redelivery that may have been lost while its handler
        ran (`t.lost`): a copy counting one more lost run goes back to the queue (then
        the original is acked), and the handler runs on that copy. Should this run be
        lost too, the copy comes back with the right count; prefetched deliveries that
        never started are never charged.

        One charged run at a time (`slot_free`): another redelivery waits
        until the charged copy came back and was settled. Charged together, the
        redeliveries prefetched behind a message that kills the process would all be
        charged, and lost with it, round after round; run uncharged meanwhile, that
        message could run uncharged too."""
        n = (t.lost or 0) + 1
        self._emit(Stage.REQUEUED, t, f"redelivered: run on a copy counting lost run {n}")
        self.charging, self._charged_at = uuid.uuid4().hex, self._clock()
        hdrs = copies.restamp_headers(t, self.charging)
        hdrs[H.LOST] = n
        return self._confirms.issue(t, self.policy.queue, hdrs, CopyPurpose.RESTAMP)

    def slot_free(self) -> bool:
        """May a redelivery's run be charged now (see `_charge_lost`)? Not while the
        last charged copy is on its way back or running here, for at most CHARGE_WAIT
        seconds (it may have gone to another consumer)."""
        c = self._charged
        if self.charging is None and (c is None or c.settled or not self._ledger.current(c)):
            return True
        return self._clock() - self._charged_at > CHARGE_WAIT

    def channel_closed(self) -> None:
        """The channel is gone: so is the slot, and the suspects waiting for it (the
        broker requeued them)."""
        self.charging, self._charged = None, None
        self._waiting.clear()

    def take_waiting(self) -> list[Tracked]:
        """Shutdown: the suspects waiting for the slot (they go back unstarted)."""
        waiting, self._waiting = self._waiting, []
        return waiting

    def start_waiting(self) -> list[Action]:
        """`tick` (unless stopping): start the first suspect that waited, once the slot
        is free."""
        while self._waiting and self.slot_free():
            t = self._waiting.pop(0)
            if not t.settled and self._ledger.current(t):
                return [Start(t.tag)]
        return []
