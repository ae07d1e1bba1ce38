"""The console's index of the dead letters it holds: groups, counts, claims, history.

No I/O here. The holder (`_holder.py`) adds what it receives and removes what
it settled; the web pages read snapshots. One lock guards everything; every
method takes it for a short, bounded time (group pages copy at most a page).

Claims: an action (replay, delete) first claims the entries it will settle.
A claimed entry is never claimed again until released, so two people replaying
the same group at once never replay one message twice: the second gets only
what the first did not take.
"""

from __future__ import annotations

import datetime as _dt
import threading
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ..dead_letters._letter import DeadLetter
from ._groups import GroupKey


@dataclass(slots=True, eq=False)
class Entry:
    """One dead letter the console holds unacked on one of its channels."""

    id: int
    dlq: str
    slot: int
    """Which of the holder's channels for this DLQ holds it."""
    generation: int
    """That channel's generation: a tag of an older, closed channel is never acked."""
    method: Any
    """Its basic.deliver (delivery tag, redelivered, exchange, routing key)."""
    dl: DeadLetter
    props: Any
    body: bytes
    at: float
    """When it failed (its dead-lettered-at header; else when the console received it)."""
    key: GroupKey
    claimed: bool = False


@dataclass(slots=True)
class Group:
    key: GroupKey
    members: dict[int, None] = field(default_factory=dict)
    first: float = 0.0
    last: float = 0.0
    stale: bool = False
    """first/last need recomputing (a member left)."""
    came_back: int = 0
    """Members that had been replayed before and failed again."""


@dataclass(frozen=True, slots=True)
class GroupView:
    id: str
    key: GroupKey
    count: int
    first: float
    last: float
    came_back: int
    replayed_here: bool
    """This console replayed from this group before (so new members came back)."""


@dataclass(frozen=True, slots=True)
class DlqView:
    name: str
    held: int
    groups: int
    oldest: float | None
    newest: float | None
    seconds: dict[int, int]
    """Failures per second (epoch second -> count) of the dead letters held."""


@dataclass(frozen=True, slots=True)
class AuditLine:
    at: float
    who: str
    action: str
    what: str
    result: str


def failure_time(dl: DeadLetter, received: float) -> float:
    """Epoch seconds a dead letter failed at (from its headers), else `received`."""
    for text in (dl.dead_lettered_at, dl.last_failure):
        if text:
            try:
                t = _dt.datetime.fromisoformat(text)
            except ValueError:
                continue
            if t.tzinfo is None:
                t = t.replace(tzinfo=_dt.UTC)
            return t.timestamp()
    return received


SORTS = ("count", "last", "name")
"""How the failure groups can be sorted: largest first, last seen first, by name."""


def _matches(key: GroupKey, needle: str) -> bool:
    return any(
        needle in part.casefold() for part in (key.dlq, key.listener, key.error_type, key.message)
    )


class Store:
    """Entries by id, grouped; claims; per-DLQ counts per second; replay history; audit."""

    AUDIT_MAX = 10_000

    def __init__(self, dlqs: Iterable[str]) -> None:
        self.lock = threading.Lock()
        self.dlqs: list[str] = list(dlqs)
        self._entries: dict[int, Entry] = {}
        self._groups: dict[str, Group] = {}
        self._seconds: dict[str, Counter[int]] = {q: Counter() for q in self.dlqs}
        self._held: Counter[str] = Counter()
        self._next = 1
        self._replayed_groups: set[str] = set()
        self.history: dict[str, list[str]] = {}
        """message id -> lines about what this console did with it (replays, deletes)."""
        self.audit: list[AuditLine] = []
        self.errors: list[str] = []
        """What went wrong on the broker side (channel closed, ...), newest last."""

    # -- the holder's side ----------------------------------------------------------------

    def add(
        self,
        dlq: str,
        slot: int,
        generation: int,
        method: Any,
        dl: DeadLetter,
        props: Any,
        body: bytes,
        key: GroupKey,
        received: float | None = None,
    ) -> Entry:
        at = failure_time(dl, time.time() if received is None else received)
        with self.lock:
            e = Entry(self._next, dlq, slot, generation, method, dl, props, body, at, key)
            self._next += 1
            self._entries[e.id] = e
            gid = key.id
            g = self._groups.get(gid)
            if g is not None:
                e.key = g.key  # one key object per group, not per dead letter
            if g is None:
                g = self._groups[gid] = Group(key, first=at, last=at)
            elif g.members:
                g.first, g.last = min(g.first, at), max(g.last, at)
            else:
                g.first = g.last = at
                g.stale = False
            g.members[e.id] = None
            if dl.replayed:
                g.came_back += 1
            self._seconds[dlq][int(at)] += 1
            self._held[dlq] += 1
            return e

    def remove(self, ids: Iterable[int]) -> int:
        """Forget entries (settled, or requeued by the broker); how many were known."""
        n = 0
        with self.lock:
            for i in ids:
                e = self._entries.pop(i, None)
                if e is None:
                    continue
                n += 1
                gid = e.key.id
                g = self._groups[gid]
                del g.members[i]
                if e.dl.replayed:
                    g.came_back -= 1
                if not g.members and gid not in self._replayed_groups:
                    del self._groups[gid]
                else:
                    g.stale = True
                m = self._seconds[e.dlq]
                second = int(e.at)
                m[second] -= 1
                if m[second] <= 0:
                    del m[second]
                self._held[e.dlq] -= 1
        return n

    def drop_channel(self, dlq: str, slot: int, generation: int) -> int:
        """Forget what one closed channel held (the broker has requeued it)."""
        with self.lock:
            gone = [
                e.id
                for e in self._entries.values()
                if e.dlq == dlq and e.slot == slot and e.generation == generation
            ]
        return self.remove(gone)

    # -- claims ---------------------------------------------------------------------------

    def claim(self, ids: Iterable[int]) -> list[Entry]:
        """The entries of `ids` nobody else has claimed, now claimed by the caller."""
        out = []
        with self.lock:
            for i in ids:
                e = self._entries.get(i)
                if e is not None and not e.claimed:
                    e.claimed = True
                    out.append(e)
        return out

    def release(self, entries: Iterable[Entry]) -> None:
        with self.lock:
            for e in entries:
                e.claimed = False

    def group_ids(self, gid: str) -> list[int]:
        with self.lock:
            g = self._groups.get(gid)
            return list(g.members) if g is not None else []

    def dlq_ids(self, dlq: str) -> list[int]:
        with self.lock:
            return [e.id for e in self._entries.values() if e.dlq == dlq]

    def mark_replayed(self, gids: Iterable[str]) -> None:
        with self.lock:
            self._replayed_groups.update(gids)

    def note(self, message_id: str | None, line: str) -> None:
        with self.lock:
            self.history.setdefault(message_id or "(no id)", []).append(line)

    def log(self, who: str, action: str, what: str, result: str) -> AuditLine:
        line = AuditLine(time.time(), who, action, what, result)
        with self.lock:
            self.audit.append(line)
            del self.audit[: -self.AUDIT_MAX]
        return line

    def error(self, text: str) -> None:
        with self.lock:
            self.errors.append(text)
            del self.errors[:-50]

    # -- the pages' side ------------------------------------------------------------------

    def entry(self, i: int) -> Entry | None:
        with self.lock:
            return self._entries.get(i)

    def held(self, dlq: str) -> int:
        with self.lock:
            return self._held[dlq]

    def _fresh(self, g: Group) -> Group:
        if g.stale and g.members:
            times = [self._entries[i].at for i in g.members]
            g.first, g.last, g.stale = min(times), max(times), False
        return g

    def groups(
        self, dlq: str | None = None, *, sort: str = "count", search: str = ""
    ) -> list[GroupView]:
        """Failure groups (of one DLQ or all) whose DLQ, listener, error type or message
        contain `search` (case-insensitive), sorted by `sort` (SORTS): largest first,
        last seen newest first, or by name (error type, message, listener)."""
        if sort not in SORTS:
            raise ValueError(f"sort must be one of {', '.join(SORTS)}")
        needle = search.strip().casefold()
        with self.lock:
            out = [
                GroupView(
                    gid,
                    g.key,
                    len(g.members),
                    self._fresh(g).first,
                    g.last,
                    g.came_back,
                    gid in self._replayed_groups,
                )
                for gid, g in self._groups.items()
                if (dlq is None or g.key.dlq == dlq) and (not needle or _matches(g.key, needle))
            ]
        if sort == "last":
            out.sort(key=lambda v: (-v.last, -v.count, v.id))
        elif sort == "name":
            out.sort(key=lambda v: (v.key.error_type, v.key.message, v.key.listener, v.id))
        else:
            out.sort(key=lambda v: (-v.count, -v.last, v.id))
        return out

    def group(self, gid: str, offset: int = 0, limit: int = 200) -> tuple[GroupView, list[Entry]]:
        """A group and a page of its members (KeyError if there is no such group)."""
        with self.lock:
            g = self._fresh(self._groups[gid])
            view = GroupView(
                gid, g.key, len(g.members), g.first, g.last, g.came_back,
                gid in self._replayed_groups,
            )  # fmt: skip
            page = []
            for n, i in enumerate(g.members):
                if n >= offset + limit:
                    break
                if n >= offset:
                    page.append(self._entries[i])
        return view, page

    def overview(self) -> list[DlqView]:
        with self.lock:
            out = []
            for q in self.dlqs:
                gs = [self._fresh(g) for g in self._groups.values() if g.key.dlq == q and g.members]
                out.append(
                    DlqView(
                        q,
                        self._held[q],
                        len(gs),
                        min((g.first for g in gs), default=None),
                        max((g.last for g in gs), default=None),
                        dict(self._seconds[q]),
                    )
                )
        return out

    def history_of(self, message_id: str | None) -> list[str]:
        with self.lock:
            return list(self.history.get(message_id or "(no id)", ()))
