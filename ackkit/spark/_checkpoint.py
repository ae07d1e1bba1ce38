"""Reading Spark's own checkpoint: which offsets a batch covers, what Spark committed.

Through `Store`, so a checkpoint on an object store (s3a://, gs://, abfss://) is read
the same way as a local one."""

from __future__ import annotations

import json
import os

from .._core.errors import AckkitError
from ._store import Store, masked


class AckFailed(AckkitError):
    """The batch was written but the source runner could not ack it. The query fails; on
    restart Spark replays the batch (the writer must be idempotent per batch id) and the
    redelivered messages are acked then."""


def _store(checkpoint: str | os.PathLike[str] | Store) -> Store:
    return checkpoint if isinstance(checkpoint, Store) else Store(checkpoint)


def batch_offsets(
    checkpoint: str | os.PathLike[str] | Store, batch_id: int
) -> list[tuple[str, int]]:
    """(queue, end offset) of every rabbitmq source in `<checkpoint>/offsets/<batch_id>`.

    Spark writes that file before it runs the batch: a version line, a metadata line,
    then one line per source (JSON, or "-" when the source has no offset yet).
    """
    offsets = _store(checkpoint).child("offsets")
    try:
        lines = offsets.read(str(batch_id)).decode().splitlines()
    except FileNotFoundError:
        raise AckFailed(
            f"{masked(offsets.location)}/{batch_id} does not exist: ack_after_commit(checkpoint="
            "...) must be the query's checkpointLocation (and the rabbitmq source's "
            "'checkpoint' option)"
        ) from None
    out = []
    for line in lines[2:]:
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            off = json.loads(line)
        except ValueError:
            continue
        if isinstance(off, dict) and "ackkit" in off and "seq" in off:
            out.append((str(off["ackkit"]), int(off["seq"])))
    return out


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
