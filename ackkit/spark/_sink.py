"""ack_after_commit: a foreachBatch wrapper that acks a batch once its output is written."""

from __future__ import annotations

import collections
import logging
import os
import shutil
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from ._checkpoint import AckFailed, batch_offsets
from ._faults import crash_point
from ._ipc import RunnerUnreachable, request
from ._options import ipc_address, local_path
from ._store import masked, normalize_location

log = logging.getLogger("ackkit.spark")

Writer = Callable[[Any, int], None]


class AckAfterCommit:
    """`writeStream.foreachBatch(AckAfterCommit(writer, checkpoint=...))`.

    Calls `writer(df, batch_id)`; only when it returns are the batch's deliveries acked,
    on the channel that received them, as one multiple-ack (the source runner does it
    and answers once the broker has processed the ack). If the writer raises, nothing
    is acked and the exception fails the query. Counters of what was acked are kept on
    the instance (in the driver process).
    """

    def __init__(
        self, writer: Writer, *, checkpoint: str | os.PathLike[str], timeout: float = 120.0
    ):
        self.writer = writer
        self.checkpoint = normalize_location(checkpoint)
        self.timeout = timeout
        self.batches = 0
        self.acked = 0
        self.held = 0
        self.last_batch: int | None = None
        self.history: collections.deque[tuple[int, str, int, int]] = collections.deque(maxlen=1000)
        """(batch_id, queue, end offset, deliveries acked) of the latest batches."""

    def __call__(self, df: Any, batch_id: int) -> None:
        crash_point("before_write", batch_id)
        self.writer(df, batch_id)
        crash_point("after_write", batch_id)
        ends = batch_offsets(self.checkpoint, batch_id)
        if len(ends) > 1:
            # Several queues (shards): each runner acks its own share, at the same time.
            with ThreadPoolExecutor(min(len(ends), 16), "ackkit-ack") as pool:
                replies = list(pool.map(lambda qe: self._ack(batch_id, *qe), ends))
        else:
            replies = [self._ack(batch_id, q, e) for q, e in ends]
        for (queue, end), reply in zip(ends, replies, strict=True):
            self.acked += int(reply.get("acked", 0))
            self.history.append((batch_id, queue, end, int(reply.get("acked", 0))))
            self.held += int(reply.get("held", 0))
        self.batches += 1
        self.last_batch = batch_id
        crash_point("after_ack", batch_id)

    def _ack(self, batch_id: int, queue: str, end: int) -> dict[str, Any]:
        """Tell the runner of `queue` that its batch up to `end` is written; its answer."""
        req = {"op": "written", "end": end, "batch": batch_id, "checkpoint": self.checkpoint}
        try:
            reply = request(ipc_address(self.checkpoint, queue), req, self.timeout)
        except (RunnerUnreachable, OSError) as exc:
            raise AckFailed(
                f"batch {batch_id} was written but the rabbitmq source for queue {queue!r} did "
                f"not answer ({exc}); is its 'checkpoint' option {masked(self.checkpoint)!r}?"
            ) from None
        if not reply.get("ok"):
            raise AckFailed(f"batch {batch_id}: the source could not ack: {reply.get('error')}")
        if not reply.get("sent", 1):
            # The connection is down: the broker requeues these, and the source acks
            # the redelivered copies as soon as they come (their batch is written).
            log.warning("ackkit.spark: batch %d: acks not sent (connection lost)", batch_id)
        return reply


def ack_after_commit(
    writer: Writer, *, checkpoint: str | os.PathLike[str], timeout: float = 120.0
) -> AckAfterCommit:
    """Wrap a foreachBatch writer so that a batch's messages are acked only after it returned.

    `checkpoint` is the query's checkpointLocation (also the source's `checkpoint` option).
    For an exactly-once effect the writer must be idempotent per batch_id: a batch replayed
    after a crash has the same batch_id and exactly the same rows (see `parquet_batches`).
    """
    return AckAfterCommit(writer, checkpoint=checkpoint, timeout=timeout)


def parquet_batches(path: str | os.PathLike[str], *, compression: str = "snappy") -> Writer:
    """An idempotent foreachBatch writer: batch N goes to `<path>/batch=N/`, atomically.

    The batch is written to a hidden temporary directory (`.tmp-<N>-<id>`: a leading dot
    is skipped by Spark's and pyarrow's readers, whatever follows) and renamed into place;
    a batch_id that is already there was written before a crash and is skipped (its
    replay holds the same rows). Leftovers of a write cut short are removed by the next
    write. Reading `path` back gives a `batch` column. Local (or mounted) paths only: the
    rename is a local file-system rename.
    """
    root = Path(local_path(os.fspath(path)))
    swept = False

    def write(df: Any, batch_id: int) -> None:
        nonlocal swept
        if not swept:
            # A driver killed mid-write left its temporary directory: nobody else writes here.
            for old in root.glob(".tmp-*") if root.is_dir() else ():
                shutil.rmtree(old, ignore_errors=True)
            swept = True
        target = root / f"batch={batch_id}"
        if target.exists():
            return
        root.mkdir(parents=True, exist_ok=True)
        tmp = root / f".tmp-{batch_id}-{uuid.uuid4().hex[:8]}"
        try:
            df.write.option("compression", compression).parquet(str(tmp))
            os.rename(tmp, target)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise

    return write
