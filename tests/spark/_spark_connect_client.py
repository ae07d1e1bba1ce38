"""A Spark Connect client that reads a RabbitMQ queue with the rabbitmq source, or a
stream with the rabbitmq-stream source.

    python tests/spark/_spark_connect_client.py sc://127.0.0.1:PORT URL QUEUE BASE SINK
    python tests/spark/_spark_connect_client.py sc://127.0.0.1:PORT URL STREAM BASE stream PORT

Runs in a process of its own (no JVM here: the query runs in the Spark Connect
server). SINK is `foreachBatch` (ack_after_commit around idempotent Parquet batches:
the function runs server-side) or `parquet` (Spark's file sink, acked through the
source's commit()); `stream` reads the stream STREAM (stream port PORT) into idempotent
Parquet batches. The query is a Trigger.AvailableNow run. Prints one JSON line:
{"ok": true, "batches": ..., "progress": ...} or {"ok": false, "stage": ..., "error": ...}.
"""

from __future__ import annotations

import json
import sys
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def main() -> int:
    remote, url, queue, base, sink = sys.argv[1:6]
    stage = "connect"
    try:
        from pyspark.sql import SparkSession

        spark = SparkSession.builder.remote(remote).getOrCreate()
        stage = "register"
        import ackkit.spark as aks
        from spark.orders_pipeline import Order

        ck = str(Path(base) / "ck")
        stage = "read_stream"
        if sink == "stream":
            df = aks.read_stream_source(
                spark, url=url, checkpoint=ck, stream_port=int(sys.argv[6]), stream=queue,
                max_messages_per_trigger=100,
            )  # fmt: skip
            stage = "start"
            query = (
                df.select("stream", "offset", "message_id")
                .writeStream.option("checkpointLocation", ck)
                .trigger(availableNow=True)
                .foreachBatch(aks.parquet_batches(Path(base) / "out"))
                .start()
            )
            return _run(query, spark)
        df = aks.read_stream(
            spark, url=url, queue=queue, checkpoint=ck, model=Order, maxMessagesPerTrigger=100
        )
        rows = df.select("seq", "message_id", *Order.model_fields)
        stage = "start"
        w = rows.writeStream.option("checkpointLocation", ck).trigger(availableNow=True)
        if sink == "foreachBatch":
            w = w.foreachBatch(
                aks.ack_after_commit(aks.parquet_batches(Path(base) / "out"), checkpoint=ck)
            )
        else:
            w = w.format("parquet").option("path", str(Path(base) / "out"))
        query = w.start()
        stage = "run"
        return _run(query, spark)
    except BaseException as exc:  # the finding is the error itself
        msg = f"{type(exc).__name__}: {exc}"
        print(json.dumps({"ok": False, "stage": stage, "error": msg[:4000]}), flush=True)
        traceback.print_exc()
        return 1


def _run(query: Any, spark: Any) -> int:
    done = query.awaitTermination(240)
    if not done:
        query.stop()
        raise TimeoutError(f"the query did not end within 240 s: {query.lastProgress}")
    exc = query.exception()
    if exc is not None:
        raise RuntimeError(str(exc))
    progress = query.recentProgress
    print(json.dumps({"ok": True, "batches": len(progress)}), flush=True)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
