"""Deployment changes between restarts, decided without I/O.

Spark keeps one offset per streaming source in its checkpoint and hands them back by
position: the i-th source of the restarted query gets the i-th offset recorded. The
source's offsets name their queue (`{"ackkit": queue, "seq": n}`), so the plan here
makes position and name agree (`source_order`), and the reader refuses an offset that
names another queue (`check_offset`) instead of reading from the wrong place.

The write-ahead log of a queue belongs to one checkpoint (`wal_owner`) and never runs
ahead of its offsets (`batch_to_offer`); shard queues left beyond the shard count are
refused (`check_extra_shards`); what the source does when its consumer's channel is
closed by the broker is `channel_verdict`.
Callers carry these decisions out; nothing here touches a file, Spark or a broker.
"""

from __future__ import annotations

import enum
import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .._core.errors import AckkitError


class DeploymentChanged(AckkitError, ValueError):
    """The query was restarted with a change its checkpoint cannot follow; nothing was
    declared or read. The message says what changed and what to do."""


def _names(qs: Sequence[str]) -> str:
    return ", ".join(repr(q) for q in qs)


def source_order(
    requested: Sequence[str],
    recorded: Sequence[str | None] | None,
    *,
    checkpoint: str = "the checkpoint",
    by_name: bool = False,
) -> list[str]:
    """The order to union the per-queue sources in, so that Spark hands every source the
    offset of its own queue.

    `by_name`: Spark matches the sources by name (Spark 4.2+ source evolution, on, with a
    checkpoint that is new or recorded names): any order, adding and removing queues
    are all fine.

    `recorded`: the queue of each rabbitmq source, in the order of the checkpoint's newest
    offsets (None for a new checkpoint, an entry None for a source with no offset yet).
    A new checkpoint gets the names sorted (any later reordering of `queues=` is then
    the same query); an existing one keeps the order it recorded, whatever order the
    queues are given in now. Adding or removing queues is refused: Spark cannot add or
    remove a source of a checkpointed query."""
    names = list(requested)
    if len(set(names)) != len(names):
        raise ValueError(f"queue names must be distinct, got {names!r}")
    if not recorded or by_name:
        return sorted(names)
    rec = list(recorded)
    known = [q for q in rec if q is not None]
    if len(known) == len(rec) and len(set(known)) == len(known) and set(known) == set(names):
        return known
    if len(rec) == len(names) and set(known) <= set(names) and len(set(known)) == len(known):
        # Some source had no offset yet: keep the recorded ones in place, fill the gaps.
        rest = iter(sorted(set(names) - set(known)))
        return [q if q is not None else next(rest) for q in rec]
    added = sorted(set(names) - set(known))
    removed = sorted(set(known) - set(names))
    what = []
    if added:
        what.append(f"adds {_names(added)}")
    if removed:
        what.append(f"removes {_names(removed)}")
    raise DeploymentChanged(
        f"{checkpoint} was written by a query reading {_names(known)}; this one "
        f"{' and '.join(what) or 'reads ' + _names(names)}. Spark cannot add or remove a "
        "source of a checkpointed query (it keeps one offset per source, by position). "
        "Keep the queues this checkpoint reads; read a new queue in a query with its own "
        "checkpoint (or stop this query once its queues are drained and start the new "
        "set on a new checkpoint). On Spark 4.2+, a query started on a new checkpoint "
        "with spark.sql.streaming.queryEvolution.enableSourceEvolution=true names its "
        "sources and may add and remove queues later"
    )


def shard_order(
    exchange: str,
    queues: Sequence[str],
    recorded: Sequence[str | None] | None,
    *,
    checkpoint: str = "the checkpoint",
) -> list[str]:
    """`source_order` for the shard queues `queues` of `exchange`, with the refusal of a
    shard-count change worded for it. Decided before anything is declared: a refused
    change leaves the broker as it was (no exchange bound to new shard queues)."""
    known = [q for q in recorded or () if q is not None]
    if not known or set(known) == set(queues):
        return source_order(queues, recorded, checkpoint=checkpoint)
    prefix = f"{exchange}.shard-"
    if known and all(q.startswith(prefix) for q in known):
        was = f"shards={len(recorded or ())}"
    else:
        was = f"queues {_names(known)}"
    raise DeploymentChanged(
        f"{checkpoint} was written by a query reading {was}; this one asks for exchange "
        f"{exchange!r} with shards={len(queues)}. A checkpointed query cannot change its "
        "shard count (each shard is a source with its own offset; the key-to-shard "
        "mapping changes with the count). Nothing was declared. Restart with the old "
        "shard count; to change it, let that query drain every shard queue (stop the "
        "publishers first), then start the new count on a new checkpoint, and when "
        "shrinking unbind or delete the shard queues no longer read (or they keep "
        "receiving messages)"
    )


@dataclass(frozen=True)
class ShardQueue:
    """A shard queue seen on the broker: its name, ready messages and consumers."""

    queue: str
    messages: int
    consumers: int


def check_extra_shards(exchange: str, shards: int, extra: Sequence[ShardQueue]) -> None:
    """Refuse to read `shards` shards of `exchange` while shard queues beyond them exist
    (`extra`: `<exchange>.shard-<shards>` and up, as found on the broker before anything
    is declared).

    Such a queue is left over from a layout with more shards (read on another
    checkpoint): the exchange stays bound to it (or a publisher with the old count picks
    it), so part of the new messages would land where this query never reads, and the
    messages it holds already would never be read either."""
    if not extra:
        return
    held = ", ".join(
        f"{q.queue!r} ({q.messages} message{'s' if q.messages != 1 else ''}"
        + (f", {q.consumers} consumer{'s' if q.consumers != 1 else ''})" if q.consumers else ")")
        for q in extra
    )
    were = shards + len(extra)
    raise DeploymentChanged(
        f"exchange {exchange!r} has shard queues beyond shards={shards}: {held}. They are "
        f"left from a layout with shards={were} or more; the exchange (or a publisher with "
        "that count) keeps routing part of the messages to them, and this query would "
        "never read them. Nothing was declared. Read with the old shard count until those "
        "queues are empty (stop the publishers first), then delete them (rabbitmqctl "
        "delete_queue, or the management UI) and start the smaller count on a new "
        "checkpoint"
    )


def source_name(queue: str) -> str:
    """The name a source of `queue` gets in Spark (letters, digits and underscores only;
    distinct queues get distinct names)."""
    safe = re.sub(r"[^A-Za-z0-9]", "_", queue)[:60]
    return f"rabbitmq_{safe}_{hashlib.sha256(queue.encode()).hexdigest()[:8]}"


def check_offset(queue: str, offset: Mapping[str, Any] | None, what: str = "offset") -> int:
    """The sequence number in `offset` when it is this queue's; refuses another queue's
    offset (Spark hands offsets out by position, so a changed union order would hand a
    source another queue's position and duplicate or skip rows)."""
    if not isinstance(offset, Mapping) or "seq" not in offset:
        raise DeploymentChanged(f"the rabbitmq source of {queue!r} got a foreign {what} {offset!r}")
    owner = offset.get("ackkit")
    if owner is not None and owner != queue:
        raise DeploymentChanged(
            f"Spark handed the rabbitmq source of {queue!r} the {what} of queue {owner!r}: "
            "the sources of this query are unioned in another order than when the "
            "checkpoint was written. Union them in the checkpoint's order (ackkit.spark."
            "read_stream does so by itself), or use a new checkpoint"
        )
    return int(offset["seq"])


def batch_to_offer(
    queue: str,
    start: int,
    logged: Sequence[tuple[int, int]],
    *,
    wal: str = "the write-ahead log",
    checkpoint: str = "the checkpoint",
) -> tuple[int, int] | None:
    """Which logged batch (start, end] to offer again when Spark asks for data after
    `start`: the one starting there (handed out before Spark logged its offsets), or None
    for a new batch. Refuses when the log already holds batches after `start` that do not
    start there: the log went further than the checkpoint's offsets (a checkpoint
    restored from an older copy, or partly deleted), and reading on would hand the same
    messages out under other offsets."""
    for s, e in logged:
        if s == start:
            return s, e
    ahead = [(s, e) for s, e in logged if e > start]
    if not ahead:
        return None
    s, e = ahead[0]
    raise DeploymentChanged(
        f"Spark asks the rabbitmq source of {queue!r} for data after offset {start}, but "
        f"its write-ahead log {wal} already holds batch ({s}, {e}] and {len(ahead) - 1} "
        f"later: the log has gone further than the offsets in {checkpoint} (a checkpoint "
        "restored from an older copy, or offsets/commits files deleted). A log and its "
        "checkpoint go together: restart on the checkpoint the log was written with, or "
        "start on a new checkpoint with a wal_location of its own (or none); delete the "
        "log only if its checkpoint is gone for good and its output is written"
    )


# -- who owns a write-ahead log ---------------------------------------------------------


@dataclass(frozen=True)
class Owner:
    """The checkpoint a write-ahead log belongs to: Spark's query id (from the
    checkpoint's `metadata`, new whenever the checkpoint is new) and where it is."""

    query_id: str
    checkpoint: str

    def to_json(self) -> dict[str, str]:
        return {"query_id": self.query_id, "checkpoint": self.checkpoint}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Owner:
        return cls(str(d.get("query_id", "")), str(d.get("checkpoint", "")))


class WalVerdict(enum.Enum):
    MINE = "mine"
    """Recorded as this checkpoint's: go on."""
    CLAIM = "claim"
    """Nobody's yet (or an older ackkit's log this checkpoint has read): record the owner."""


def wal_owner(
    wal: str,
    me: Owner,
    recorded: Owner | None,
    *,
    has_batches: bool,
    checkpoint_has_offsets: bool,
) -> WalVerdict:
    """Whether the write-ahead log at `wal` may serve checkpoint `me`.

    A log records its owner when first used. Another owner's log is refused: its batches
    would be handed to this query as if they were its own (old rows written again) and
    its offsets contradict this checkpoint's. A log without an owner (written before
    owners were recorded) is claimed when it is empty or when this checkpoint has offsets
    already (it is the query that wrote it); with batches and a new checkpoint it is
    refused too."""
    if recorded is not None:
        if recorded.query_id == me.query_id:
            return WalVerdict.MINE
        raise DeploymentChanged(
            f"the write-ahead log {wal} belongs to checkpoint {recorded.checkpoint} (query "
            f"{recorded.query_id}), not to this query's checkpoint {me.checkpoint} "
            f"({'query ' + me.query_id if me.query_id else 'new'}). A log serves one "
            "checkpoint: give this query a wal_location of "
            "its own (or none: the log then lives inside the checkpoint), or go back to the "
            f"old checkpoint; delete {wal} only if that checkpoint is gone for good and "
            "its output is written"
        )
    if has_batches and not checkpoint_has_offsets:
        raise DeploymentChanged(
            f"the write-ahead log {wal} holds batches of an earlier query (written before "
            f"logs recorded their checkpoint), and this query's checkpoint {me.checkpoint} "
            "is new. A log serves one checkpoint: give this query a wal_location of its own "
            "(or none), or restart the old query on its checkpoint; delete the log only if "
            "that checkpoint is gone for good and its output is written"
        )
    return WalVerdict.CLAIM


# -- the consumer's channel closed by the broker ----------------------------------------


@dataclass(frozen=True)
class ChannelVerdict:
    """What to do after the broker closed the consumer's channel."""

    fail: str | None = None
    """The query fails with this message (no retry)."""
    log: str | None = None
    """Log this once (warning), then retry quietly."""
    retry: bool = True


def channel_verdict(
    queue: str, code: int, text: str, *, exclusive: bool, refused_for: float, patience: float
) -> ChannelVerdict:
    """After the broker closed the consumer's channel with `code` (0: the connection went).

    * 404 (the queue is gone: deleted under the running query; its messages went with
      it): fail, never re-declare silently (a re-declared shard queue would not even be
      bound to its exchange). A restart declares it again (`declare=true`).
    * 403 on an exclusive consumer (another consumer holds the queue: another query on
      it, or this query's previous runner still shutting down): wait, saying so once;
      after `patience` seconds of refusals, fail.
    * anything else: retry (logged by the caller when not a normal close)."""
    if code == 404:
        return ChannelVerdict(
            fail=(
                f"queue {queue!r} was deleted while the query read it ({text}); the "
                "messages it held are gone with it. Restart the query to read a new queue "
                "of that name (the source declares it unless declare=false; "
                "read_stream(exchange=, shards=) binds shard queues again)"
            ),
            retry=False,
        )
    if code == 403 and exclusive:
        if refused_for >= patience:
            return ChannelVerdict(
                fail=(
                    f"queue {queue!r} has had another exclusive consumer for "
                    f"{refused_for:.0f} s ({text}): another query (with its own checkpoint) "
                    "reads it. One queue is read by one query: stop the other query, or "
                    "give this one another queue (exclusive_wait_ms sets how long to wait)"
                ),
                retry=False,
            )
        if refused_for == 0:
            return ChannelVerdict(
                log=(
                    f"waiting for {queue!r}: another consumer holds it exclusively (this "
                    "query's previous runner shutting down, or another query); retrying "
                    f"every second, failing after {patience:.0f} s"
                )
            )
    return ChannelVerdict()
