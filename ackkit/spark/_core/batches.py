"""BatchLedger: which deliveries belong to which micro-batch, and when they may be acked.

A batch-at-a-time consumer (a Spark streaming source) hands deliveries out in
batches numbered by a monotonically growing offset: a batch is the range
(start, end] of offsets, and it is identified by its `end`. A batch's
deliveries may be acked only after its output has been written durably
("written up to end"); until then they stay in flight.

The ledger also recognises copies: a delivery whose key (message id) already
belongs to a batch is never handed out again. It is held and acked together
with that batch, or acked at once when that batch has already been written.
That is how a crash between "written" and "acked" stays invisible in the
output: the broker redelivers, the ledger suppresses.

Every ack goes through the ListenerCore, so settle-once, channel generation
fencing and the contiguous multiple-ack prefix are the core's as usual. The
core's flush policy must not flush by count on its own (max_pending above the
prefetch), so that a written batch goes out as one multiple-ack frame: the
ledger refuses a core whose policy would (`BatchLedger.flush_policy` derives one).

A row that does not validate is a fact the ledger decides on (`invalid`), by the
source's `OnInvalid` policy: it fails the query, or it is dead-lettered.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import Enum

from ..._core.actions import Action
from ..._core.errors import BadPayload
from ..._core.listener import ListenerCore, Tracked
from ..._core.policy import FlushPolicy
from ..._core.step import Step


class OnInvalid(str, Enum):
    """What the source does with a body that does not validate against the model."""

    FAIL = "fail"
    """Stop the query with the validation error; nothing of the batch is acked (default)."""
    DEAD_LETTER = "dead_letter"
    """Publish it to the dead-letter queue with its reason (confirmed), then ack it; the
    rest of the batch goes on."""


class Admission(str, Enum):
    """What happened to one delivery offered to a new batch."""

    NEW = "new"
    """Handed out as a row of the batch."""
    HELD = "held"
    """A copy of a message in a batch not written yet: acked with that batch."""
    SETTLED = "settled"
    """A copy of a message in a batch already written: acked now."""
    STALE = "stale"
    """Delivered on a channel that has closed since: skipped (the broker requeued it)."""


@dataclass(frozen=True, slots=True)
class BatchPlan:
    """The outcome of `BatchLedger.plan`."""

    start: int
    end: int
    """start + number of rows; equal to start when nothing new came."""
    rows: list[int]
    """Indices (into the offered deliveries) handed out as rows, in offset order."""
    admissions: list[Admission]
    """One per offered delivery."""
    actions: list[Action] = field(default_factory=list)
    """Acks of copies whose batch was written already: carry out now."""


@dataclass(frozen=True, slots=True)
class Written:
    """The outcome of `BatchLedger.written`."""

    actions: list[Action]
    acked: int
    """Deliveries of the written batches settled as acked now."""
    held: int
    """Of those, copies that had been held for these batches."""
    stale: int
    """Deliveries of these batches that came on a closed channel (not acked; redelivered)."""


class BatchLedger:
    """Batches handed out, their deliveries, and the keys of every row still remembered."""

    def __init__(
        self,
        core: ListenerCore,
        *,
        written_upto: int = 0,
        on_invalid: OnInvalid = OnInvalid.FAIL,
    ) -> None:
        fp, prefetch = core.policy.flush_policy, core.policy.prefetch
        if prefetch == 0 or fp.max_pending <= prefetch:
            raise ValueError(
                f"a batch ledger's core must not flush acks by count (max_pending "
                f"{fp.max_pending} is not above prefetch {prefetch}): a written batch "
                "goes out as one multiple-ack; see BatchLedger.flush_policy"
            )
        self.core = core
        self.on_invalid = on_invalid
        self.written_upto = written_upto
        self.last_end = written_upto
        self._rows: dict[int, list[Tracked]] = {}
        self._held: dict[int, list[Tracked]] = {}
        self._index: dict[str, int] = {}
        self._keys: dict[int, list[str]] = {}

    @staticmethod
    def flush_policy(prefetch: int, interval: float = 0.2) -> FlushPolicy:
        """The flush policy of a batch ledger's core: never by count (the prefetch window
        cannot fill it), only by time, for the acks of dead-lettered rows."""
        return FlushPolicy(max_pending=prefetch + 1, interval=interval)

    # -- rows that do not validate ------------------------------------------

    def invalid(self, t: Tracked, error: str) -> Step | None:
        """Delivery `t`'s body does not validate (`error`). With OnInvalid.DEAD_LETTER it
        is dead-lettered now (the actions to carry out); with FAIL it stays a row of its
        batch and fails the query there (None)."""
        if self.on_invalid is OnInvalid.DEAD_LETTER:
            return self.core.finish(t, BadPayload(error))
        return None

    # -- batches from an earlier life (a write-ahead log) -------------------

    def restore(self, end: int, keys: Iterable[str | None]) -> None:
        """Remember a batch handed out before a restart (its deliveries are not tracked)."""
        own = [k for k in keys if k is not None]
        for k in own:
            self._index[k] = end
        self._keys.setdefault(end, []).extend(own)
        self.last_end = max(self.last_end, end)

    def batch_of(self, key: str) -> int | None:
        """The end of the batch a key belongs to, if remembered."""
        return self._index.get(key)

    # -- new batches -------------------------------------------------------

    def plan(self, start: int, offered: Sequence[tuple[Tracked, str | None]]) -> BatchPlan:
        """Form the batch (start, end] from `offered` deliveries, in delivery order.

        A delivery without a key is always new (it cannot be recognised as a
        copy). The batch's rows stay unacked until `written(end)`.
        """
        if start < self.last_end and offered:
            raise ValueError(f"batch must start at or after {self.last_end}, not {start}")
        core = self.core
        gen = core.generation
        admissions: list[Admission] = []
        rows: list[int] = []
        new_rows: list[Tracked] = []
        new_keys: list[str] = []
        copies: list[Tracked] = []
        settle_now: list[Tracked] = []
        pending: set[str] = set()
        held = self._held
        for i, (t, key) in enumerate(offered):
            if t.settled:
                raise ValueError(f"delivery tag {t.tag} was already settled")
            if t.generation != gen or not core.open:
                admissions.append(Admission.STALE)
                continue
            if key is not None:
                if key in pending:
                    copies.append(t)
                    admissions.append(Admission.HELD)
                    continue
                end = self._index.get(key)
                if end is not None:
                    if end <= self.written_upto:
                        settle_now.append(t)
                        admissions.append(Admission.SETTLED)
                    else:
                        held.setdefault(end, []).append(t)
                        admissions.append(Admission.HELD)
                    continue
                pending.add(key)
                new_keys.append(key)
            rows.append(i)
            new_rows.append(t)
            admissions.append(Admission.NEW)
        end = start + len(rows)
        if rows:
            self._rows[end] = new_rows
            for k in new_keys:
                self._index[k] = end
            self._keys[end] = new_keys
            self.last_end = end
        if copies:
            held.setdefault(end, []).extend(copies)
        actions: list[Action] = []
        if settle_now:
            for t in settle_now:
                actions.extend(core.finish(t))
            actions.extend(core.drain())
        return BatchPlan(start, end, rows, admissions, actions)

    # -- written: the batches' output is durable ------------------------------

    def written(self, end: int) -> Written:
        """Every batch with an end <= `end` is written: ack its deliveries and held copies."""
        if end > self.written_upto:
            self.written_upto = end
        core = self.core
        acked = held_n = stale = 0
        actions: list[Action] = []
        gen, is_open = core.generation, core.open
        for source, is_held in ((self._rows, False), (self._held, True)):
            for e in [e for e in source if e <= end]:
                ts = source.pop(e)
                for t in ts:
                    if t.settled:
                        continue
                    if t.generation != gen or not is_open:
                        stale += 1
                    else:
                        acked += 1
                        held_n += is_held
                actions.extend(core.finish_all(ts))
        actions.extend(core.drain())
        return Written(actions, acked, held_n, stale)

    # -- housekeeping ---------------------------------------------------------

    def forget(self, upto: int) -> int:
        """Forget the keys of written batches with an end <= `upto` (no longer deduplicated).

        Returns how many keys were forgotten. Batches not written yet are kept.
        """
        upto = min(upto, self.written_upto)
        n = 0
        for e in [e for e in self._keys if e <= upto]:
            for k in self._keys.pop(e):
                if self._index.get(k) == e:
                    del self._index[k]
                    n += 1
        return n

    def channel_closed(self) -> int:
        """The channel is gone: drop its deliveries (the broker requeued them); keep the keys.

        Returns how many were dropped.
        """
        n = sum(len(v) for v in self._rows.values()) + sum(len(v) for v in self._held.values())
        self._rows.clear()
        self._held.clear()
        self.core.channel_closed()
        return n

    @property
    def holding(self) -> int:
        """Copies held for batches not written yet."""
        return sum(len(v) for v in self._held.values())

    @property
    def unwritten(self) -> int:
        """Rows handed out in batches not written yet (this channel)."""
        return sum(len(v) for v in self._rows.values())

    @property
    def remembered(self) -> int:
        """Keys remembered for deduplication."""
        return len(self._index)
