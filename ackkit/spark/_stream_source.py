"""The `rabbitmq-stream` streaming data source: RabbitMQ Streams and super streams.

Where things run (PySpark 4.x, `DataSourceStreamReader`):

* the driver's source runner plans: `initialOffset`, `latestOffset` (it asks the broker
  for each partition's first and tail offsets, checks for data loss and decides the
  batch's end positions with `ackkit._core.stream_offsets`), `partitions` and `commit`;
* executors read: `read(partition)` reads exactly the planned offsets of one partition
  stream on the process's stream link (`_stream_broker.link`) and hands them to Spark
  as Arrow rows, part by part while the rest is read.

Spark's offset log is the truth: a batch is the per-partition offset ranges between two
logged offsets, so a replayed batch reads exactly the same records again. Nothing is
acked and nothing is removed from the stream; exactly-once output needs a sink that is
idempotent per batch_id (`ackkit.spark.parquet_batches`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from .._core.headers import REASON
from . import _stream_broker as io
from ._core.batches import OnInvalid
from ._core.stream_offsets import (
    DataLossError,
    Loss,
    Range,
    RangeCursor,
    StartFrom,
    from_json,
    initial_positions,
    losses,
    lost_in,
    plan_end,
    ranges,
    skip_lost,
    to_json,
)
from ._schema import load_model
from ._store import Store, child_location
from ._stream_options import StreamSourceOptions
from ._stream_rows import Record, StreamRowSchema, record

log = logging.getLogger("ackkit.spark.streams")
FORMAT = "rabbitmq-stream"
ROWS_PER_BATCH = 10_000


class StreamRange(InputPartition):
    """One Spark input partition: offsets `[first, until)` of one partition stream."""

    def __init__(self, stream: str, first: int, until: int) -> None:
        self.stream = stream
        self.first = first
        self.until = until

    @property
    def range(self) -> Range:
        return Range(self.stream, self.first, self.until)


def _rows(opts: StreamSourceOptions) -> StreamRowSchema:
    return StreamRowSchema(load_model(opts.model) if opts.model else None)


class RabbitMQStreamDataSource(DataSource):
    """`spark.readStream.format("rabbitmq-stream")`: see `ackkit.spark.read_stream_source`."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> Any:
        return _rows(StreamSourceOptions.parse(self.options)).spark

    def streamReader(self, schema: Any) -> RabbitMQStreamReader:
        return RabbitMQStreamReader(dict(self.options))


class RabbitMQStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Plans offset ranges on the driver, reads them on executors (see the module doc).

    Counters (in the driver's source runner): `lost_records`, the records found missing
    at planning time when fail_on_data_loss is off."""

    def __init__(self, options: dict[str, str]) -> None:
        self.options = options
        self.opts = StreamSourceOptions.parse(options)
        self._target: dict[str, int] | None = None
        self.lost_records = 0

    # -- the driver --------------------------------------------------------------------

    def _partitions(self) -> list[str]:
        o = self.opts
        if o.super_stream:
            parts = io.link(o.connection).partitions(o.super_stream)
            if not parts:
                raise ValueError(f"super stream {o.super_stream!r} has no partitions")
            return sorted(parts)
        assert o.stream is not None
        if not io.link(o.connection).stream_exists(o.stream):
            raise ValueError(f"stream {o.stream!r} does not exist")
        return [o.stream]

    def _probe(
        self, parts: Sequence[str], *kinds: str, at: int | None = None
    ) -> list[dict[str, int]]:
        return io.link(self.opts.connection).probe(parts, kinds, self.opts.probe_timeout, at)

    def _store(self) -> Store:
        name = self.opts.name
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", name)[:80]
        digest = hashlib.sha256(name.encode()).hexdigest()[:8]
        return Store(child_location(self.opts.checkpoint, "ackkit-streams", f"{safe}-{digest}"))

    def initialOffset(self) -> dict[str, Any]:
        # Spark asks again when a restarted query replays its first batch: the positions
        # are resolved once ("latest" moves) and kept in the checkpoint.
        store = self._store()
        try:
            saved = json.loads(store.read("initial.json"))
            return to_json(self.opts.name, from_json(self.opts.name, saved, "initial offset"))
        except FileNotFoundError:
            pass
        parts = self._partitions()
        start = self.opts.starting_position
        firsts, tails = self._probe(parts, "first", "tail")
        at = None
        if start.kind is StartFrom.TIMESTAMP:
            (at,) = self._probe(parts, "timestamp", at=start.value)
        positions = initial_positions(parts, start, firsts=firsts, tails=tails, at_timestamp=at)
        offset = to_json(self.opts.name, positions)
        store.put("initial.json", json.dumps(offset, sort_keys=True).encode())
        log.info("ackkit.spark: %s starts at %s", self.opts.name, positions)
        return offset

    def getDefaultReadLimit(self) -> ReadLimit:
        n = self.opts.max_messages_per_trigger
        return ReadAllAvailable() if n is None else ReadMaxRows(n)

    def prepareForTriggerAvailableNow(self) -> None:
        # Trigger.AvailableNow: read up to the tails seen now, then stop.
        parts = self._partitions()
        (self._target,) = self._probe(parts, "tail")
        log.info("ackkit.spark: %s reads up to %s (AvailableNow)", self.opts.name, self._target)

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        name = self.opts.name
        positions = from_json(name, start, "start offset")
        parts = self._partitions()
        firsts, tails = self._probe(parts, "first", "tail")
        lost = losses(positions, firsts, tails)
        reset: set[str] = set()
        if lost:
            self._on_loss(lost)
            positions, reset = skip_lost(positions, lost)
        budget = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        end = plan_end(positions, tails, budget=budget, cap=self._target)
        for p in reset:
            end[p] = 0
        return to_json(name, end)

    def _on_loss(self, lost: list[Loss]) -> None:
        if self.opts.fail_on_data_loss:
            raise DataLossError("; ".join(loss.message() for loss in lost))
        self.lost_records += sum(loss.count for loss in lost)
        for loss in lost:
            log.warning("ackkit.spark: data loss, going on: %s", loss.message())

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        name = self.opts.name
        s, e = from_json(name, start, "start offset"), from_json(name, end, "end offset")
        return [StreamRange(r.stream, r.first, r.until) for r in ranges(s, e)]

    def commit(self, end: dict[str, Any]) -> None:
        ref = self.opts.store_offsets_as
        if not ref:
            return
        positions = from_json(self.opts.name, end, "committed offset")
        try:
            io.link(self.opts.connection).store_offsets(ref, positions)
        except Exception as exc:  # informational only: the checkpoint is the truth
            log.warning("ackkit.spark: could not store offsets on the broker: %s", exc)

    # -- an executor ---------------------------------------------------------------------

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        # Rows go to Spark part by part while the rest of the range is read: the JVM
        # converts and writes one part while this process reads and decodes the next.
        # An error after some parts (a lost offset, an invalid record) fails the task, and
        # Spark discards what the task gave.
        assert isinstance(partition, StreamRange)
        rng = partition.range
        o = self.opts
        rows = _rows(o)

        def make(offset: int, ts: int, data: bytes) -> Record:
            return record(rng.stream, offset, ts, data, rows.model)

        link = io.link(o.connection)
        cursor = RangeCursor(rng)
        bad: list[Record] = []
        for part in link.read_parts(cursor, o.read_timeout, make, ROWS_PER_BATCH):
            good = [r for r in part if r.error is None]
            if len(good) < len(part):
                bad += _invalid(o, [r for r in part if r.error is not None])
            if good:
                yield rows.batch(good)
        lost: list[Loss] = []
        if cursor.gaps:  # retention, or entries that are not messages: which?
            (firsts,) = link.probe([rng.stream], ["first"], o.probe_timeout)
            lost = lost_in(cursor.gaps, firsts.get(rng.stream))
        if lost:
            if o.fail_on_data_loss:
                raise DataLossError("; ".join(loss.message() for loss in lost))
            for loss in lost:
                log.warning("ackkit.spark: data loss while reading, going on: %s", loss.message())
        if bad:
            _dead_letter(o, bad)


def _invalid(opts: StreamSourceOptions, bad: list[Record]) -> list[Record]:
    """Invalid records to dead-letter; with on_invalid=fail, the error that fails the task."""
    if opts.on_invalid is OnInvalid.FAIL:
        r = bad[0]
        raise ValueError(
            f"record {r.stream}@{r.offset} (message_id {r.message_id or '-'}) does not "
            f"validate: {r.error} (set option on_invalid=dead_letter to dead-letter "
            "such records instead of failing the query)"
        )
    return bad


def _dead_letter(opts: StreamSourceOptions, bad: Sequence[Record]) -> None:
    """Publish invalid records to the dead-letter queue (confirmed) with their reason.

    At least once: a task retried, or a batch replayed after a crash, publishes them
    again (the stream keeps them; their `x-stream`/`x-stream-offset` headers identify
    the copies)."""
    import pika
    import pika.exceptions

    from .._connection import addresses
    from .._connection.io import connect_in_turn

    conn = connect_in_turn(  # several node addresses: the first that answers
        addresses.Rotation(opts.urls),
        lambda u: pika.BlockingConnection(pika.URLParameters(u)),
        final=(
            pika.exceptions.ProbableAuthenticationError,
            pika.exceptions.ProbableAccessDeniedError,
        ),
        what="ackkit.spark dead letters",
    )
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare(opts.dlq, durable=True)
        for r in bad:
            headers: dict[str, Any] = dict(r.headers or {})
            headers.update({REASON: r.error, "x-stream": r.stream, "x-stream-offset": r.offset})
            props = pika.BasicProperties(
                message_id=r.message_id,
                content_type=r.content_type,
                headers=headers,
                delivery_mode=2,
            )
            ch.basic_publish("", opts.dlq, r.body, props, mandatory=True)
    finally:
        conn.close()
