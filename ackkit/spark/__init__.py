"""RabbitMQ as a Spark Structured Streaming source, acked only after a batch is written.

    import ackkit.spark as aks

    aks.register(spark)
    df = aks.read_stream(spark, url=URL, queue="orders", checkpoint=CKPT, model=Order,
                         on_invalid="dead_letter")
    query = (df.writeStream
             .foreachBatch(aks.ack_after_commit(aks.parquet_batches(OUT), checkpoint=CKPT))
             .option("checkpointLocation", CKPT)
             .start())

Source options (`spark.readStream.format("rabbitmq").option(...)`): `url`, `queue`,
`checkpoint` (required; the query's checkpointLocation), `max_batch` (10000),
`prefetch` (2 x max_batch, at most 65535; max_batch is capped to it), `model`
("package.module:Class" of a pydantic model; its fields become columns),
`on_invalid` ("fail" | "dead_letter"), `dead_letter_queue` ("{queue}.dlq"), `key`
("message_id" | "body" | "none"), `max_wait_ms` (500), `linger_ms` (50), `heartbeat`
(30), `exclusive` (true), `declare` (true), `fsync` (true), `retain_batches` (10).

Rows: `seq` (the message's offset in this stream, stable across replays),
`message_id`, `body`, `headers` (map<string,string>), `routing_key`, `exchange`,
`redelivered`, `attempt`, `content_type`, `timestamp`, then the model's fields.

Guarantee (exactly-once effect)
-------------------------------
With `ack_after_commit` around a writer that is idempotent per batch_id (such as
`parquet_batches`), and the queue consumed only by this query: after any number of
driver crashes (SIGKILL at any point: before the write, during it, after it and
before the ack, after the ack and before Spark's commit log) and restarts on the same
checkpoint, every message that was published to the queue and carries a distinct
message_id is in the output exactly once, or (when it fails the model and
on_invalid=dead_letter) in the dead-letter queue at least once and not in the
output; and it is acked only after the batch holding it was written. How:

* The source writes each batch to a write-ahead log in the checkpoint (fsynced)
  before Spark learns its offsets; a replayed batch is read back from that log, so
  it has the same batch_id and the same rows, and the idempotent writer makes the
  second write a no-op.
* Acks happen in the foreachBatch wrapper, after the writer returned, never in
  `commit()` (which Spark calls only when planning the next batch): the last batch
  is acked without waiting for new data and no batch size can stall the acks.
* A message redelivered after a crash or a reconnect whose message_id is in a batch
  already handed out is not handed out again: it is acked with that batch (at once,
  if the batch is written). Ids are remembered for every batch not yet written and
  for the last `retain_batches` written ones.

Messages without a message_id cannot be recognised when redelivered: they are
delivered at least once (after a crash between handing a batch out and acking it,
they can be in the output twice). Use `key="body"` when bodies are unique, or give
every message an id. A producer that publishes the same message_id twice has the
second copy suppressed while the first is remembered.
"""

from __future__ import annotations

import os
from typing import Any

try:
    import pyarrow  # noqa: F401
    import pyspark  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "ackkit.spark needs pyspark, pandas and pyarrow: pip install 'ackkit[spark]'"
    ) from exc

from pydantic import BaseModel

from ._checkpoint import AckFailed, batch_offsets
from ._consumer import SourceFailed
from ._ipc import request
from ._options import KeyFrom, OnInvalid, SourceOptions, ipc_address, local_path
from ._schema import RowSchema, model_path
from ._sink import AckAfterCommit, ack_after_commit, parquet_batches
from ._source import RabbitMQDataSource, RabbitMQStreamReader
from ._wal import WalError

FORMAT = "rabbitmq"


def register(spark: Any) -> None:
    """Register the `rabbitmq` streaming source with a SparkSession."""
    spark.dataSource.register(RabbitMQDataSource)


def read_stream(
    spark: Any,
    *,
    url: str,
    queue: str,
    checkpoint: str | os.PathLike[str],
    model: type[BaseModel] | str | None = None,
    **options: Any,
) -> Any:
    """`spark.readStream.format("rabbitmq")` with these options (registers the source)."""
    register(spark)
    r = spark.readStream.format(FORMAT).option("url", url).option("queue", queue)
    r = r.option("checkpoint", os.fspath(checkpoint))
    if model is not None:
        r = r.option("model", model if isinstance(model, str) else model_path(model))
    for k, v in options.items():
        r = r.option(k, str(v).lower() if isinstance(v, bool) else str(v))
    return r.load()


def source_stats(
    checkpoint: str | os.PathLike[str], queue: str, timeout: float = 10.0
) -> dict[str, Any]:
    """Counters of a running source (received, buffered, dead_lettered, ...), asked over IPC."""
    path = local_path(os.fspath(checkpoint))
    return request(ipc_address(path, queue), {"op": "stats"}, timeout)


__all__ = [
    "FORMAT",
    "AckAfterCommit",
    "AckFailed",
    "KeyFrom",
    "OnInvalid",
    "RabbitMQDataSource",
    "RabbitMQStreamReader",
    "RowSchema",
    "SourceFailed",
    "SourceOptions",
    "WalError",
    "ack_after_commit",
    "batch_offsets",
    "model_path",
    "parquet_batches",
    "read_stream",
    "register",
    "source_stats",
]
