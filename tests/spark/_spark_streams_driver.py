"""A Spark driver the streams kill tests SIGKILL: reads a stream or super stream into
idempotent Parquet batches, forever (until killed), or until the output holds EXPECT
rows (then it stops the query and exits 3, as the queue source's crash driver does).

    python tests/spark/_spark_streams_driver.py URL STREAM_PORT KIND NAME BASE [EXPECT]

KIND is "stream" or "super_stream". The master is local[2,4] (a task whose Python
worker is killed is retried, up to 4 attempts, as on a cluster), or whatever
`ACKKIT_SPARK_CONF=<JSON object>` sets (`spark.master` of a standalone cluster).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import ackkit.spark as aks  # noqa: E402


def _rows(out: Path) -> int:
    import pyarrow.parquet as pq

    files = [p for p in out.glob("batch=*/*.parquet")] if out.exists() else []
    return sum(pq.ParquetFile(p).metadata.num_rows for p in files)


def main() -> int:
    url, port, kind, name, base = sys.argv[1:6]
    expect = int(sys.argv[6]) if len(sys.argv) > 6 else None
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master("local[2,4]")
        .appName("ackkit-streams-kill")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.python.authenticate.socketTimeout", "120s")
    )
    for key, value in json.loads(os.environ.get("ACKKIT_SPARK_CONF") or "{}").items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    ck = Path(base) / "ck"
    out = Path(base) / "out"
    df = aks.read_stream_source(
        spark,
        url=url,
        checkpoint=ck,
        stream_port=int(port),
        max_messages_per_trigger=300,
        **{kind: name},
    )
    query = aks.start(
        df.select("stream", "offset", "message_id")
        .writeStream.foreachBatch(aks.parquet_batches(out))
        .option("checkpointLocation", str(ck))
        .trigger(processingTime="200 milliseconds")
    )
    if expect is None:
        query.awaitTermination()
        return 0
    deadline = time.monotonic() + 300
    while _rows(out) < expect:
        if query.exception() is not None or time.monotonic() > deadline:
            print(f"stopped short: {_rows(out)} of {expect} rows, {query.exception()}")
            return 1
        time.sleep(0.5)
    query.stop()
    return 3


if __name__ == "__main__":
    sys.exit(main())
