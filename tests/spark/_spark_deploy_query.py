"""The query of the deployment tests, started in the test's SparkSession or in a driver
subprocess that kills itself (`_spark_deploy_driver.py`)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import ackkit.spark as aks
from spark.orders_pipeline import Order

MAX_BATCH = 50


def start(
    spark: Any,
    url: str,
    base: str | os.PathLike[str],
    *,
    ck: str = "ck",
    queues: list[str] | None = None,
    exchange: str | None = None,
    shards: int | None = None,
    **options: Any,
) -> Any:
    """Read `queues` (or the shards of `exchange`) into idempotent Parquet batches under
    `<base>/out-<ck>`, acked after each write; returns the started query."""
    base = Path(base)
    where: dict[str, Any] = (
        {"queues": queues}
        if queues is not None
        else {"exchange": exchange, "shards": shards, "shard_kind": aks.ShardKind.CONSISTENT}
    )
    ckpt = base / ck
    df = aks.read_stream(
        spark,
        url=url,
        checkpoint=ckpt,
        model=Order,
        max_batch=MAX_BATCH,
        on_invalid="dead_letter",
        **where,
        **options,
    )
    rows = df.select("seq", "message_id", "queue", "order_id")
    acking = aks.ack_after_commit(aks.parquet_batches(base / f"out-{ck}"), checkpoint=ckpt)
    # aks.start: started again when Spark's source runner misses its fixed 10 s start-up
    return aks.start(
        rows.writeStream.foreachBatch(acking).option("checkpointLocation", os.fspath(ckpt))
    )
