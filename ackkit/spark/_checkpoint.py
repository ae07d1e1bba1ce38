"""Reading Spark's own checkpoint: which offsets a batch covers, what Spark committed.

Through `Store`, so a checkpoint on an object store (s3a://, gs://, abfss://) is read
the same way as a local one."""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from typing import Any

from .._core.errors import AckkitError
from ._store import Store, masked


class AckFailed(AckkitError):
    """The batch was written but the source runner could not ack it. The query fails; on
    restart Spark replays the batch (the writer must be idempotent per batch id) and the
    redelivered messages are acked then."""


def _store(checkpoint: str | os.PathLike[str] | Store) -> Store:
    return checkpoint if isinstance(checkpoint, Store) else Store(checkpoint)


_NAMED = re.compile(r"^([A-Za-z0-9_]+):(.*)$")


def _source_lines(lines: list[str]) -> list[tuple[str | None, Any]]:
    """(source name, offset) of each source line of an offsets file: after a version line
    and a metadata line, one line per source: JSON, "-" (no offset yet, offset None), or,
    with named sources (Spark 4.2+ source evolution, version "v2"), `name:JSON`."""
    out: list[tuple[str | None, Any]] = []
    for line in lines[2:]:
        line = line.strip()
        name = None
        m = _NAMED.match(line)
        if m:
            name, line = m[1], m[2].strip()
        if line == "-":
            out.append((name, None))
            continue
        try:
            out.append((name, json.loads(line)))
        except ValueError:
            out.append((name, {}))
    return out


def _ours(off: Any) -> bool:
    return isinstance(off, dict) and "ackkit" in off and "seq" in off


def batch_offsets(
    checkpoint: str | os.PathLike[str] | Store, batch_id: int
) -> list[tuple[str, int]]:
    """(queue, end offset) of every rabbitmq source in `<checkpoint>/offsets/<batch_id>`.

    Spark writes that file before it runs the batch (see `_source_lines`)."""
    offsets = _store(checkpoint).child("offsets")
    try:
        lines = offsets.read(str(batch_id)).decode().splitlines()
    except FileNotFoundError:
        raise AckFailed(
            f"{masked(offsets.location)}/{batch_id} does not exist: ack_after_commit(checkpoint="
            "...) must be the query's checkpointLocation (and the rabbitmq source's "
            "'checkpoint' option)"
        ) from None
    return [(str(o["ackkit"]), int(o["seq"])) for _n, o in _source_lines(lines) if _ours(o)]


@dataclass(frozen=True)
class Recorded:
    """The rabbitmq sources of a checkpoint's newest offsets."""

    queues: list[str | None]
    """Each source's queue in Spark's order (None: no offset yet, or not a rabbitmq one)."""
    by_name: bool
    """Spark matches sources by name (source evolution), not by position."""


def recorded_queues(checkpoint: str | os.PathLike[str] | Store) -> Recorded | None:
    """The sources in the checkpoint's newest offsets; None for a checkpoint without any.

    Spark hands positional offsets back by position: `queues` is the order the sources
    must be unioned in for each to get its own queue's offset (`_deploy.source_order`)."""
    store = _store(checkpoint).child("offsets")
    ids = [int(n) for n in store.names() if n.isdigit()]
    for batch_id in sorted(ids, reverse=True):
        try:
            lines = store.read(str(batch_id)).decode().splitlines()
        except FileNotFoundError:
            continue
        found = _source_lines(lines)
        queues: list[str | None] = [
            str(o["ackkit"]) if _ours(o) else None for _n, o in found if o is None or _ours(o)
        ]
        by_name = bool(found) and all(n is not None for n, _o in found)
        return Recorded(queues, by_name) if queues else None
    return None


def committed_end(checkpoint: str | os.PathLike[str] | Store, queue: str) -> int:
    """The end offset of `queue`'s source in the newest batch Spark committed (0 if none).

    Spark writes `<checkpoint>/commits/<id>` once batch `id`'s sink has returned.
    """
    store = _store(checkpoint)
    ids = [int(n) for n in store.child("commits").names() if n.isdigit()]
    for batch_id in sorted(ids, reverse=True):
        try:
            ends = [e for q, e in batch_offsets(store, batch_id) if q == queue]
        except AckFailed:
            continue
        if ends:
            return max(ends)
    return 0


def query_id(checkpoint: str | os.PathLike[str] | Store) -> str | None:
    """Spark's id of the query this checkpoint belongs to (`<checkpoint>/metadata`, written
    when the query first starts; a new checkpoint gets a new id), None when absent."""
    try:
        meta = json.loads(_store(checkpoint).read("metadata").decode() or "{}")
    except (FileNotFoundError, ValueError):
        return None
    qid = meta.get("id") if isinstance(meta, dict) else None
    return str(qid) if qid else None
