"""Offset planning of a RabbitMQ Streams source: pure decisions, no broker, no Spark.

A position is the *next* offset to read in one stream partition (a plain stream, or
one partition stream of a super stream); a set of positions maps partition names to
positions. Spark stores the end positions of every micro-batch in its checkpoint, and
those are the truth: a batch reads, per partition, the offsets
``[start.get(p, 0), end[p])``. Because positions are keyed by partition name, adding,
removing or reordering partitions between batches or restarts never shifts one
partition's positions onto another:

* a partition that appears (not in the start positions) is read from offset 0, the
  beginning of a new stream (anything retention removed before is reported as loss);
* a partition that disappears keeps its last position, carried over unchanged, so it
  continues where it stopped if it comes back;
* a partition whose tail is unknown this time (its probe did not answer) stays put.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import Enum

Positions = Mapping[str, int]


class DataLossError(RuntimeError):
    """Offsets the query had not read yet are gone from the stream (retention removed
    them, or the stream was deleted and created again). Raised unless the source was
    told to continue past lost data (option ``fail_on_data_loss=false``)."""


class StartFrom(str, Enum):
    """Where a query without a checkpoint starts reading each partition."""

    EARLIEST = "earliest"
    """The first offset the stream still holds."""
    LATEST = "latest"
    """The offset after the last one written when the query starts (new data only)."""
    OFFSET = "offset"
    """A given offset, the same in every partition (clamped to what the stream holds)."""
    TIMESTAMP = "timestamp"
    """The first chunk written at or after a given time (epoch milliseconds)."""


@dataclass(frozen=True)
class StartingPosition:
    """A parsed ``starting_position`` option: ``earliest``, ``latest``, ``offset:<n>`` or
    ``timestamp:<epoch ms>``."""

    kind: StartFrom
    value: int | None = None

    @classmethod
    def parse(cls, text: str) -> StartingPosition:
        kind, _, raw = text.strip().lower().partition(":")
        try:
            start = StartFrom(kind)
        except ValueError:
            raise ValueError(
                f"starting_position must be earliest, latest, offset:<n> or timestamp:<ms>, "
                f"not {text!r}"
            ) from None
        if start in (StartFrom.EARLIEST, StartFrom.LATEST):
            if raw:
                raise ValueError(f"starting_position {kind} takes no value, got {text!r}")
            return cls(start)
        try:
            value = int(raw)
        except ValueError:
            raise ValueError(
                f"starting_position {kind}:<n> needs an integer, got {text!r}"
            ) from None
        if value < 0:
            raise ValueError(f"starting_position {kind} must be >= 0, got {value}")
        return cls(start, value)


@dataclass(frozen=True)
class Range:
    """Offsets ``[first, until)`` of one partition: one Spark input partition."""

    stream: str
    first: int
    until: int

    @property
    def count(self) -> int:
        """How many offsets the range holds."""
        return self.until - self.first


@dataclass(frozen=True)
class Loss(Range):
    """Offsets ``[first, until)`` of ``stream`` that were not read and are gone."""

    def message(self) -> str:
        return (
            f"stream {self.stream!r}: offsets {self.first}..{self.until - 1} "
            f"({self.count} messages) were not read and are no longer in the stream "
            "(retention removed them, or the stream was re-created). Set option "
            "fail_on_data_loss=false to continue past them (counted and logged)."
        )


def initial_positions(
    partitions: Iterable[str],
    start: StartingPosition,
    *,
    firsts: Positions,
    tails: Positions,
    at_timestamp: Positions | None = None,
) -> dict[str, int]:
    """The positions a new query starts at. ``firsts``: the first offset each partition
    holds; ``tails``: the next offset to be written; ``at_timestamp``: the first offset
    at or after the start timestamp (from the broker). A partition missing from a map
    is empty: it starts at 0 (the latest-known tail for ``latest``)."""
    out: dict[str, int] = {}
    for p in sorted(partitions):
        first, tail = firsts.get(p, 0), tails.get(p, 0)
        if start.kind is StartFrom.EARLIEST:
            out[p] = first
        elif start.kind is StartFrom.LATEST:
            out[p] = tail
        elif start.kind is StartFrom.OFFSET:
            assert start.value is not None
            out[p] = min(max(start.value, first), max(tail, first))
        else:
            out[p] = (at_timestamp or {}).get(p, tail)
    return out


def admit(available: Mapping[str, tuple[int, int]], budget: int | None) -> dict[str, int]:
    """End positions within a budget of ``budget`` records (None: everything).

    ``available`` maps a partition to ``(start, tail)``. The budget is shared fairly
    (water filling: no partition gets more than another unless the other has run dry);
    what is left after an even split goes to partitions in an order rotated by the start
    positions, so a budget smaller than the number of partitions still moves every
    partition over successive batches. Each end is within ``[start, tail]``; with any
    record available and a budget >= 1, at least one is admitted."""
    ends = {p: s for p, (s, _t) in available.items()}
    want = {p: max(0, t - s) for p, (s, t) in available.items()}
    if budget is None:
        return {p: s + want[p] for p, s in ends.items()}
    left = max(0, budget)
    hungry = sorted(p for p in want if want[p] > 0)
    while left > 0 and hungry:
        share = left // len(hungry)
        if share == 0:
            turn = sum(available[p][0] for p in hungry) % len(hungry)
            for p in (hungry[turn:] + hungry[:turn])[:left]:
                ends[p] += 1
                want[p] -= 1
            break
        for p in hungry:
            take = min(share, want[p])
            ends[p] += take
            want[p] -= take
            left -= take
        hungry = [p for p in hungry if want[p] > 0]
    return ends


def plan_end(
    start: Positions,
    tails: Positions,
    *,
    budget: int | None = None,
    cap: Positions | None = None,
) -> dict[str, int]:
    """The end positions of the next batch.

    ``tails``: the next offset to be written, per partition the broker lists now (a
    partition whose tail is unknown is left out). ``cap``: the positions a
    Trigger.AvailableNow run must not pass (taken when the run started; partitions
    absent from it are not read in that run). Partitions only in ``start`` keep their
    positions. A tail below the start position means the stream was re-created: that
    partition keeps its position here, and `losses` reports it."""
    available: dict[str, tuple[int, int]] = {}
    for p, tail in tails.items():
        s = start.get(p, 0)
        top = tail if cap is None else min(tail, cap.get(p, s))
        available[p] = (s, max(s, top))
    end = {p: int(v) for p, v in start.items()}
    end.update(admit(available, budget))
    return dict(sorted(end.items()))


def losses(start: Positions, firsts: Positions, tails: Positions) -> list[Loss]:
    """Unread offsets that are gone: a partition whose first offset is past its start
    position (retention), or whose tail is below it (the stream was re-created: all of
    its old unread offsets are gone and the new ones are unknown to the checkpoint)."""
    out = []
    for p in sorted(firsts):
        s = start.get(p, 0)
        tail = tails.get(p)
        if tail is not None and tail < s:
            out.append(Loss(p, tail, s))
        elif firsts[p] > s:
            out.append(Loss(p, s, firsts[p]))
    return out


def skip_lost(start: Positions, lost: Iterable[Loss]) -> tuple[dict[str, int], set[str]]:
    """Start positions moved past lost offsets (to continue with fail_on_data_loss off),
    and the partitions that were re-created (a loss below the start position): their
    next batch ends at 0, so that the one after reads the new stream from its start."""
    out = dict(start)
    reset: set[str] = set()
    for loss in lost:
        if loss.first < out.get(loss.stream, 0) and loss.until == out.get(loss.stream, 0):
            out[loss.stream] = 0
            reset.add(loss.stream)
        else:
            out[loss.stream] = max(out.get(loss.stream, 0), loss.until)
    return out, reset


def ranges(start: Positions, end: Positions) -> list[Range]:
    """The non-empty offset ranges of a batch, one per partition, sorted by name."""
    out = []
    for p in sorted(end):
        first = start.get(p, 0)
        if end[p] > first:
            out.append(Range(p, first, end[p]))
    return out


class RangeCursor:
    """Follows the offsets delivered while one `Range` is read (an executor's decisions).

    A subscription at offset ``first`` delivers whole chunks: offsets before ``first``
    come first and are skipped. An offset past the next one expected leaves a gap
    (`gaps`): offsets the broker did not deliver. Offsets are not dense: entries that
    are not messages (offset tracking, written by ``store_offset``) take offsets too,
    and readers never see them; only `lost_in` (with the stream's first offset) tells
    a gap retention made. `offer` says whether a delivered offset belongs to the
    batch; `done` when every offset of the range is accounted for.
    """

    def __init__(self, rng: Range) -> None:
        self.range = rng
        self.expected = rng.first
        self.gaps: list[Loss] = []

    @property
    def done(self) -> bool:
        return self.expected >= self.range.until

    def offer(self, offset: int) -> bool:
        if offset < self.expected or self.done:
            return False
        if offset > self.expected:
            self.gaps.append(Loss(self.range.stream, self.expected, min(offset, self.range.until)))
            self.expected = min(offset, self.range.until)
            if self.done:
                return False
        self.expected = offset + 1
        return True


def lost_in(gaps: Iterable[Loss], first: int | None) -> list[Loss]:
    """The parts of `gaps` retention removed: those below the stream's first offset now
    (`first`; None when the stream is empty: everything). Gaps above it were entries
    that are not messages. (A non-message entry at the very head of what retention
    left is counted as lost too: the report errs towards failing loudly.)"""
    out = []
    for g in gaps:
        top = g.until if first is None else min(g.until, first)
        if top > g.first:
            out.append(Loss(g.stream, g.first, top))
    return out


def to_json(name: str, positions: Positions) -> dict[str, object]:
    """The offset Spark stores: the source's name and its positions, sorted."""
    return {"ackkit_stream": name, "positions": {p: int(positions[p]) for p in sorted(positions)}}


def from_json(name: str, offset: Mapping[str, object], what: str = "offset") -> dict[str, int]:
    """Positions from an offset `to_json` made; a ValueError when it is another source's."""
    got = offset.get("ackkit_stream")
    positions = offset.get("positions")
    if got != name or not isinstance(positions, Mapping):
        raise ValueError(
            f"the checkpoint's {what} {dict(offset)!r:.200} is not one of the stream source "
            f"{name!r}: was the checkpoint made by another query or source?"
        )
    return {str(p): int(v) for p, v in positions.items()}
