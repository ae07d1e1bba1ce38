"""RabbitMQ as a Spark Structured Streaming source, acked only after a batch is written.

    import ackkit.spark as aks

    aks.register(spark)
    df = aks.read_stream(spark, url=URL, queue="orders", checkpoint=CKPT, model=Order,
                         on_invalid="dead_letter")
    query = aks.start(df.writeStream
                      .foreachBatch(aks.ack_after_commit(aks.parquet_batches(OUT), checkpoint=CKPT))
                      .option("checkpointLocation", CKPT))

Source options (`spark.readStream.format("rabbitmq").option(...)`): `url`, `queue`,
`checkpoint` (required; the query's checkpointLocation), `maxMessagesPerTrigger` (20000;
`max_batch` is its former name), `maxBytesPerTrigger` (none: no cap on a batch's body
bytes; one larger message goes alone), `prefetch` (2 x maxMessagesPerTrigger, at most
65535; maxMessagesPerTrigger is capped to it), `model`
("package.module:Class" of a pydantic model; its fields become columns),
`on_invalid` ("fail" | "dead_letter"), `dead_letter_queue` ("{queue}.dlq"), `key`
("message_id" | "body" | "none"), `max_wait_ms` (500), `linger_ms` (50), `heartbeat`
(30), `exclusive` (true), `exclusive_wait_ms` (60000: how long another consumer may
hold the queue before the query fails), `declare` (true), `fsync` (true),
`retain_batches` (10), `wal_location` (inside the checkpoint; a log serves one
checkpoint). The checkpoint may be a path or a URI (s3a://,
gs://, abfss://, hdfs://: the source's files go through pyarrow.fs). `read_stream` also
takes `queues=[...]` or `exchange=`/`shards=` (one source per queue, unioned).

Trigger.AvailableNow (Spark 4.2+): with `writeStream.trigger(availableNow=True)` the
query reads the messages each queue holds when it starts (counted before consuming),
in batches within the caps, acks each batch after it is written, and stops; messages
published meanwhile are left in the queue for the next run. A run killed half-way and
run again on the same checkpoint neither loses nor duplicates a message.

Rows: `seq` (the message's offset in this stream, stable across replays),
`message_id`, `body`, `headers` (map<string,string>), `routing_key`, `exchange`,
`redelivered`, `attempt`, `content_type`, `timestamp`, then the model's fields.

Guarantee (exactly-once effect)
-------------------------------
Assume: the query writes through `ack_after_commit(writer, ...)`, the writer is
idempotent per batch_id (writing batch N twice leaves the output as if written once;
`parquet_batches` is), the queue is consumed only by this query (the source consumes
exclusively), every message has a distinct message_id, and the query is restarted on
the same checkpoint after a failure. Then, whatever process dies at whatever point
(SIGKILL of the driver before, during or after the write, after the ack and before
Spark's commit log; the source runner after logging a batch; a lost connection), once
the restarted query has drained the queue:

* every message is in the output exactly once, or, when it fails the model and
  on_invalid=dead_letter, in the dead-letter queue (at least once; with an
  `ackkit-reason` header) and not in the output;
* no message was acked before the batch holding it had been written;
* the queue has nothing ready and nothing unacked.

How:

* The source writes each batch (rows and their keys) to a write-ahead log inside the
  checkpoint, fsynced, before Spark learns its offsets. A batch Spark replays is read
  back from that log (same batch_id, same rows: the idempotent writer makes it a
  no-op); one the source logged but Spark did not is offered again as it was.
* Acks happen in the foreachBatch wrapper after the writer returned (the source runner
  sends them on the channel the deliveries came on, one multiple-ack per batch), never
  in `commit()`, which Spark calls only when planning the next batch: the last batch is
  acked without waiting for new data, and no batch size can stall the acks.
* A redelivered message (after a crash or a reconnect) whose message_id is in a batch
  already handed out is not handed out again: it is acked with that batch, or at once
  if that batch is written ("written" is persisted before the acks are sent). Ids are
  remembered for every batch not yet written and for the last `retain_batches` written
  ones; a delivery tag of a closed channel is never acked.

Messages without a message_id cannot be recognised when redelivered: they are
delivered at least once (a crash between handing a batch out and acking it can put
them in the output twice). Give every message an id, or use `key="body"` when bodies
are unique. A producer that publishes one message_id twice has the second copy
suppressed (acked, not written) while the first is remembered.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from typing import Any

try:
    import pyarrow  # noqa: F401
    import pyspark  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "ackkit.spark needs pyspark, pandas and pyarrow: pip install 'ackkit[spark]'"
    ) from exc

from pydantic import BaseModel

from ..shards import (
    ShardKind,
    ShardLayout,
    ShardPublisher,
    declare_shards,
    shard_queues,
    shards_beyond,
)
from ._checkpoint import AckFailed, batch_offsets, query_id, recorded_queues
from ._consumer import SourceFailed
from ._core.stream_offsets import DataLossError
from ._deploy import (
    DeploymentChanged,
    Owner,
    ShardQueue,
    check_extra_shards,
    shard_order,
    source_name,
    source_order,
)
from ._ipc import request
from ._options import KeyFrom, OnInvalid, SourceOptions, ipc_address, url_option, wal_dir
from ._schema import RowSchema, model_path
from ._sink import AckAfterCommit, ack_after_commit, parquet_batches
from ._source import RabbitMQDataSource, RabbitMQStreamReader
from ._start import start
from ._store import Store, check_location, masked, normalize_location
from ._stream_source import FORMAT as STREAM_FORMAT
from ._stream_source import RabbitMQStreamDataSource
from ._wal import WalError, WriteAheadLog

FORMAT = "rabbitmq"


def register(spark: Any) -> None:
    """Register the `rabbitmq` (queues) and `rabbitmq-stream` (RabbitMQ Streams)
    streaming sources with a SparkSession."""
    spark.dataSource.register(RabbitMQDataSource)
    spark.dataSource.register(RabbitMQStreamDataSource)


def read_stream_source(
    spark: Any,
    *,
    url: str | Sequence[str],
    checkpoint: str | os.PathLike[str],
    stream: str | None = None,
    super_stream: str | None = None,
    model: type[BaseModel] | str | None = None,
    **options: Any,
) -> Any:
    """`spark.readStream.format("rabbitmq-stream")` (registers the sources): a plain
    `stream` or a `super_stream` (one Spark input partition per partition stream).

    Options: `stream_port` (5552), `starting_position` ("earliest" | "latest" |
    "offset:<n>" | "timestamp:<epoch ms>"; used when the checkpoint has no offsets),
    `max_messages_per_trigger`, `fail_on_data_loss` (true), `on_invalid` ("fail" |
    "dead_letter"), `dead_letter_queue` ("<name>.dlq"), `store_offsets_as` (a consumer
    name to store committed positions under on the broker, for other tools; never read
    back), `probe_timeout_ms` (1000), `read_timeout_ms` (120000). The offsets in the
    checkpoint name their partition streams. See docs/guide/spark-streams.md.

    `url`: one URL, the comma form or a list of a cluster's node addresses (the first
    stream connection tries the nodes' hosts in order, on `stream_port`)."""
    if (stream is None) == (super_stream is None):
        raise ValueError("give one of stream= or super_stream=")
    register(spark)
    r = spark.readStream.format(STREAM_FORMAT).option("url", url_option(url))
    r = r.option("checkpoint", os.fspath(checkpoint))
    r = r.option("super_stream" if super_stream else "stream", super_stream or stream)
    if model is not None:
        r = r.option("model", model if isinstance(model, str) else model_path(model))
    for k, v in options.items():
        r = r.option(k, str(v).lower() if isinstance(v, bool) else str(v))
    return r.load()


def read_stream(
    spark: Any,
    *,
    url: str | Sequence[str],
    checkpoint: str | os.PathLike[str],
    queue: str | None = None,
    queues: Sequence[str] | None = None,
    exchange: str | None = None,
    shards: int | None = None,
    shard_kind: ShardKind | str = ShardKind.AUTO,
    model: type[BaseModel] | str | None = None,
    **options: Any,
) -> Any:
    """`spark.readStream.format("rabbitmq")` with these options (registers the source).

    One of: `queue` (one queue), `queues` (several), or `exchange` and `shards` (declares
    the N shard queues `<exchange>.shard-<i>` and the hashing exchange, see
    `ackkit.shards.declare_shards`). With several queues, each is read by a source of its
    own (its own runner process, connection, write-ahead log and acks) and the sources
    are unioned; a `queue` column then says which queue a row came from ((queue, seq) is
    unique).

    On a checkpoint that has offsets, the sources are unioned in the order it recorded
    (Spark hands offsets back by position; each names its queue), so `queues=` may be
    given in any order; adding or removing a queue, or changing `shards=`, raises
    `DeploymentChanged` before anything is declared on the broker, and so do shard
    queues beyond `shards=` left on the broker by a layout with more shards (they would
    keep receiving messages this query never reads).

    `url`: one URL, the comma form or a list of a cluster's node addresses: each source
    connects to the first that answers and, after a lost connection, to the next one
    (docs/reference/configuration.md); shard queues are declared through the first."""
    url = url_option(url)
    if exchange is not None or shards is not None:
        if exchange is None or shards is None or queue is not None or queues is not None:
            raise ValueError("give exchange= and shards= together, without queue/queues")
        names = list(shard_queues(exchange, shards))
    elif queues is not None:
        if queue is not None:
            raise ValueError("give queue= or queues=, not both")
        if isinstance(queues, str):
            raise TypeError("queues= takes a list of queue names")
        names = list(queues)
        if not names or len(set(names)) != len(names) or not all(names):
            raise ValueError(f"queues= needs distinct non-empty names, got {names!r}")
    elif queue is not None:
        names = [queue]
    else:
        raise ValueError("read_stream needs queue=, queues= or exchange= with shards=")
    # Bad option values fail here, before anything is declared or started (Spark would
    # report them only from the source's first use).
    checked = SourceOptions.parse(
        {
            **{k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in options.items()},
            "url": url,
            "queue": names[0],
            "checkpoint": os.fspath(checkpoint),
        }
    )
    # Spark hands each source the offset recorded at its position: union the sources in
    # the order the checkpoint recorded (each offset names its queue), decided before
    # anything is declared on the broker.
    store = Store(checkpoint)
    recorded = recorded_queues(store)
    named = _source_evolution(spark)  # then Spark wants every source named
    by_name = named and (recorded is None or recorded.by_name)
    rec = recorded.queues if recorded is not None else None
    where = masked(store.location)
    if exchange is not None and shards is not None:
        names = shard_order(exchange, names, rec, checkpoint=where)
        first = checked.url  # the first node address: shards.py takes one URL
        extra = [ShardQueue(*q) for q in shards_beyond(first, exchange, shards)]
        check_extra_shards(exchange, shards, extra)
        declare_shards(first, exchange, shards, kind=shard_kind)
    else:
        names = source_order(names, rec, checkpoint=where, by_name=by_name)
    if options.get("wal_location"):
        _check_logs(store, names, str(options["wal_location"]), rec)
    register(spark)

    def one(q: str) -> Any:
        r = spark.readStream.format(FORMAT).option("url", url).option("queue", q)
        r = r.option("checkpoint", os.fspath(checkpoint))
        if model is not None:
            r = r.option("model", model if isinstance(model, str) else model_path(model))
        for k, v in options.items():
            r = r.option(k, str(v).lower() if isinstance(v, bool) else str(v))
        if named:
            r = r.name(source_name(q))
        return r.load()

    if queue is not None:
        return one(queue)
    from pyspark.sql import functions as F

    frames = [one(q).withColumn("queue", F.lit(q)) for q in names]
    return functools.reduce(lambda a, b: a.union(b), frames)


def _check_logs(
    checkpoint: Store, queues: list[str], wal_location: str, recorded: list[str | None] | None
) -> None:
    """Refuse before the query starts when a queue's write-ahead log under `wal_location`
    is another checkpoint's (the source runner checks again, and records the owner)."""
    me = Owner(query_id(checkpoint) or "", masked(checkpoint.location))
    for q in queues:
        wal = WriteAheadLog(wal_dir(checkpoint.location, q, check_location(wal_location)))
        wal.check_owner(me, checkpoint_has_offsets=recorded is not None and q in recorded)


EVOLUTION = "spark.sql.streaming.queryEvolution.enableSourceEvolution"


def _source_evolution(spark: Any) -> bool:
    """Whether this session names streaming sources (Spark 4.2+): offsets are then
    matched by name, not by position."""
    try:
        return str(spark.conf.get(EVOLUTION, "false")).strip().lower() == "true"
    except Exception:  # an older Spark without the setting
        return False


def source_stats(
    checkpoint: str | os.PathLike[str], queue: str, timeout: float = 10.0
) -> dict[str, Any]:
    """Counters of a running source (received, buffered, dead_lettered, ...), asked over IPC."""
    return request(ipc_address(normalize_location(checkpoint), queue), {"op": "stats"}, timeout)


__all__ = [
    "FORMAT",
    "AckAfterCommit",
    "AckFailed",
    "DataLossError",
    "DeploymentChanged",
    "KeyFrom",
    "OnInvalid",
    "RabbitMQDataSource",
    "RabbitMQStreamDataSource",
    "RabbitMQStreamReader",
    "RowSchema",
    "ShardKind",
    "ShardLayout",
    "ShardPublisher",
    "SourceFailed",
    "SourceOptions",
    "WalError",
    "ack_after_commit",
    "batch_offsets",
    "declare_shards",
    "model_path",
    "parquet_batches",
    "read_stream",
    "read_stream_source",
    "register",
    "shard_queues",
    "source_stats",
    "start",
]
