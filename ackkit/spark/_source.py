"""The `rabbitmq` streaming data source (pyspark.sql.datasource stream reader).

Where things run (PySpark 4.2+):

* `latestOffset(start, limit)` and `commit(end)` run in Spark's long-lived
  `python_streaming_source_runner` process, one per query. The broker connection,
  the write-ahead log writer and the IPC listener live there (started with the
  reader in that process). `latestOffset` takes the next batch of deliveries and
  writes it to the write-ahead log before it answers: a batch exists only once
  it is durable there.
* `read(partition)` runs in an executor's Python worker on a pickled copy of the
  reader: it reads the batch from the write-ahead log, never from the broker, and
  never imports the model (its module may exist only on the driver host). The
  first run of a batch and its replay after a restart read the same bytes.
"""

from __future__ import annotations

import atexit
import collections
import gc
import logging
import os
import resource
import signal
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadLimit, SupportsTriggerAvailableNow

from ._available import RunnerConsumer
from ._checkpoint import committed_end, query_id, recorded_queues
from ._core.batches import BatchPlan
from ._deploy import Owner, batch_to_offer, check_offset
from ._faults import crash_point
from ._ipc import IpcServer
from ._options import SourceOptions
from ._rows import Item
from ._schema import KEY_COLUMN, RowSchema, load_model
from ._store import Store, masked
from ._wal import WriteAheadLog

log = logging.getLogger("ackkit.spark")
RUNNER_SCRIPT = "python_streaming_source_runner.py"


def _offset(queue: str, seq: int) -> dict[str, Any]:
    return {"ackkit": queue, "seq": seq}


def _schema(opts: SourceOptions) -> RowSchema:
    return RowSchema(load_model(opts.model) if opts.model else None)


GC_THRESHOLD = (50_000, 20, 10)
"""The runner's collector thresholds (the interpreter's default is (700, 10, 10))."""
_gc_time = [0.0, 0.0]  # [seconds in collections so far, when the current one started]


def _gc_timer(phase: str, _info: dict[str, int]) -> None:
    if phase == "start":
        _gc_time[1] = time.perf_counter()
    else:
        _gc_time[0] += time.perf_counter() - _gc_time[1]


def _tune_gc() -> None:
    """Make the runner's garbage collector cheap per delivery (the runner process only).

    Each delivery allocates a few container objects (pika's frames, the core's record,
    the row) and a prefetch window of them stays alive until acked. With the default
    thresholds the collector ran about once per 100 deliveries and its older passes
    scanned everything start-up left (pyspark, pyarrow, pandas): about half the CPU the
    runner spent per delivery in a measurement (see docs/measured/spark.md). Start-up's
    objects are frozen (never garbage: they stay for the process's life) and the young
    generation is collected every `GC_THRESHOLD[0]` allocations. Reference cycles are
    still collected, later; nothing the source keeps depends on when."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLD)
    if _gc_timer not in gc.callbacks:
        gc.callbacks.append(_gc_timer)


def _in_source_runner() -> bool:
    """Whether this process is Spark's long-lived streaming source runner (not a planner
    or an executor worker, which also construct readers)."""
    return os.path.basename(sys.argv[0] if sys.argv else "") == RUNNER_SCRIPT


class RabbitMQDataSource(DataSource):
    """`spark.readStream.format("rabbitmq")`: see `ackkit.spark` for the options."""

    @classmethod
    def name(cls) -> str:
        return "rabbitmq"

    def schema(self) -> Any:
        return _schema(SourceOptions.parse(self.options)).spark

    def streamReader(self, schema: Any) -> RabbitMQStreamReader:
        return RabbitMQStreamReader(dict(self.options))


class WalRange(InputPartition):
    """A batch to read from the write-ahead log: sequence numbers (start, end]."""

    def __init__(self, start: int, end: int) -> None:
        self.start = start
        self.end = end


class RabbitMQStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Hands out batches of deliveries; acks wait for `ack_after_commit` (see module doc).

    Batches hold at most maxMessagesPerTrigger messages and maxBytesPerTrigger body bytes
    (the source's own options, applied in `latestOffset`; Spark's read limit is not
    used). With Trigger.AvailableNow the run reads the messages in the queue when it
    starts, then ends (`ackkit.spark._available`)."""

    def __init__(self, options: dict[str, str]) -> None:
        self.options = options
        self.opts = SourceOptions.parse(options)
        self._runner: _Runner | None = None
        if _in_source_runner():
            # Start now, not on the first read(): a restarted query first replays its
            # unfinished batch (Spark reads it back without calling read()), and that
            # batch's foreachBatch must reach this runner to ack the redelivered copies.
            self._run()

    def __getstate__(self) -> dict[str, Any]:
        return {"options": self.options, "opts": self.opts, "_runner": None}

    def _run(self) -> _Runner:
        if self._runner is None:
            self._runner = _Runner(self.opts)
        return self._runner

    def initialOffset(self) -> dict[str, Any]:
        return _offset(self.opts.queue, 0)

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        q = self.opts.queue
        return _offset(q, self._run().offer(check_offset(q, start, "start offset")))

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[WalRange]:
        q = self.opts.queue
        s, e = check_offset(q, start, "start offset"), check_offset(q, end, "end offset")
        return [WalRange(s, e)] if e > s else []

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, WalRange)
        wal = WriteAheadLog(self.opts.wal_dir)  # on an executor: read from the store
        # The logged rows are what Spark gets, plus the key column: no model needed here
        # (an executor without the model's module reads as well; Spark checks the
        # columns against the query's schema).
        for b in wal.read(partition.start, partition.end):
            yield b.drop_columns([KEY_COLUMN])

    def commit(self, end: dict[str, Any]) -> None:
        seq = check_offset(self.opts.queue, end, "committed offset")
        if self._runner is not None:
            self._runner.commit(seq)

    def prepareForTriggerAvailableNow(self) -> None:
        """Trigger.AvailableNow: count the messages in the queue now; the run reads those."""
        self._run().consumer.prepare_available_now()


class _Runner:
    """The source's state in the runner process: consumer, write-ahead log, IPC listener."""

    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts
        self.rows = _schema(opts)
        self.wal = WriteAheadLog(opts.wal_dir, fsync=opts.fsync, cache=True)
        self.wal.create()
        # The log is this checkpoint's alone: another query's batches are never handed out.
        ckpt = Store(opts.checkpoint)
        qid = query_id(ckpt) or f"path:{masked(ckpt.location)}"
        rec = recorded_queues(ckpt)
        self.wal.claim(
            Owner(qid, masked(ckpt.location)),
            checkpoint_has_offsets=rec is not None and opts.queue in rec.queues,
        )
        # Spark's commit log says a batch's sink returned: written, even if this log missed
        # it (a sink without ack_after_commit, acked only through commit()).
        self._persisted = max(self.wal.written_upto(), committed_end(opts.checkpoint, opts.queue))
        self.consumer = RunnerConsumer(opts, self.rows.model, written_upto=self._persisted)
        for s, e in self.wal.batches():
            self.consumer.restore(e, self.wal.keys(s, e, KEY_COLUMN))
        self._written_lock = threading.Lock()

        self.ipc = IpcServer(opts.address, self._handle)
        self.ipc.start()
        try:
            self.consumer.start()
        except BaseException:
            self.ipc.close()
            raise
        # pyarrow imports pandas on its first conversion (most of a second): now, while
        # the consumer connects, not inside the first batch.
        self.rows.batch(0, [], [], [])
        if _in_source_runner():  # Spark's process for this reader alone, not a host's
            _tune_gc()
        self._closed = False
        self._handed_out = 0
        self.timings: collections.deque[dict[str, float]] = collections.deque(maxlen=500)
        self.ack_timings: collections.deque[dict[str, float]] = collections.deque(maxlen=500)
        atexit.register(self.close)
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._on_sigterm)

    # -- Spark's calls --------------------------------------------------------------------

    def offer(self, start: int) -> int:
        """The end of the batch after `start`, durable in the write-ahead log (`start`:
        nothing to hand out now)."""
        q = self.opts.queue
        again = batch_to_offer(
            q,
            start,
            self.wal.batches(),
            wal=masked(self.wal.location),
            checkpoint=masked(self.opts.checkpoint),
        )
        if again is not None:
            # Handed out before (e.g. the process died before Spark logged its offsets):
            # offer exactly the same rows again.
            return again[1]
        built: list[pa.RecordBatch] = []
        t0 = time.monotonic()
        marks = [t0, t0, t0]

        def seal(items: list[Item], plan: BatchPlan) -> None:
            # Under the consumer's lock (the I/O thread pauses): CPU work only.
            marks[0] = time.monotonic()
            built.append(
                self.rows.batch(
                    start,
                    [it.meta for it in items],
                    [it.parsed for it in items],
                    [it.key for it in items],
                )
            )
            marks[1] = time.monotonic()

        plan = self.consumer.take(start, seal)
        if not built:
            return start
        # Durable before Spark hears of the batch, written after the lock is released:
        # the file's fsync waits on the disk, and meanwhile the I/O thread receives the
        # next batch instead of waiting for the lock. (Nothing acks these rows before
        # Spark has them: their notice can only come after this returns.)
        self.wal.write(start, plan.end, built[0])
        marks[2] = time.monotonic()
        # Where a batch's time went in this process (see docs/measured/spark.md).
        self.timings.append(
            {
                "start": start,
                "rows": plan.end - start,
                "called": t0,
                "wait_s": marks[0] - t0,
                "arrow_s": marks[1] - marks[0],
                "wal_s": marks[2] - marks[1],
                "returned": time.monotonic(),
            }
        )
        self._handed_out += 1
        crash_point("wal_written", self._handed_out, group=True)
        return plan.end

    def commit(self, end: int) -> None:
        # Spark logs a batch as committed only after its sink returned, so the output up
        # to `end` is written. ack_after_commit has normally acked it already; this is the
        # fallback for a sink without it.
        if end > self.consumer.ledger.written_upto:
            self.written(end)
        doomed = self.wal.prune(min(end, self._persisted), self.opts.retain_batches)
        if doomed:
            self.consumer.forget(doomed[-1][1])

    # -- the foreachBatch wrapper's calls (IPC thread) --------------------------------------

    def written(self, end: int) -> dict[str, int]:
        with self._written_lock:
            t0 = time.monotonic()
            if end > self._persisted:
                # Before acking: after a crash, redelivered copies of these rows are
                # recognised as written and acked at once.
                self.wal.set_written_upto(end)
                self._persisted = end
            t1 = time.monotonic()
            out = self.consumer.written(end)
            self.ack_timings.append({"end": end, "mark_s": t1 - t0, "ack_s": time.monotonic() - t1})
            return out

    def _handle(self, req: dict[str, Any]) -> dict[str, Any]:
        op = req.get("op")
        if op == "written":
            ckpt = req.get("checkpoint")
            if ckpt is not None and ckpt != self.opts.checkpoint:
                raise ValueError(
                    f"ack_after_commit's checkpoint {masked(ckpt)!r} is not the source's "
                    f"{masked(self.opts.checkpoint)!r}"
                )
            out = self.written(int(req["end"]))
            return {"ok": True, **out}
        if op == "stats":
            usage = resource.getrusage(resource.RUSAGE_SELF)
            cpu = round(usage.ru_utime + usage.ru_stime, 3)
            gc_s = round(_gc_time[0], 3)
            return {
                "ok": True,
                "pid": os.getpid(),
                "cpu_s": cpu,
                "gc_s": gc_s,
                **self.consumer.stats(),
            }
        if op == "timings":
            return {"ok": True, "timings": list(self.timings), "acks": list(self.ack_timings)}
        raise ValueError(f"unknown request {op!r}")

    # -- shutdown ------------------------------------------------------------------------------

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.ipc.close()
        self.consumer.stop()

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        # query.stop() terminates the runner: close the connection cleanly first.
        try:
            self.close()
        finally:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
