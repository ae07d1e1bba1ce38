"""A Spark driver the streams kill test SIGKILLs: reads a stream or super stream into
idempotent Parquet batches, forever (until killed).

    python tests/spark/_spark_streams_driver.py URL STREAM_PORT KIND NAME BASE

KIND is "stream" or "super_stream". The master is local[2,4]: a task whose Python
worker is killed is retried (up to 4 attempts), as on a cluster.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import ackkit.spark as aks  # noqa: E402


def main() -> int:
    url, port, kind, name, base = sys.argv[1:6]
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master("local[2,4]")
        .appName("ackkit-streams-kill")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.python.authenticate.socketTimeout", "120s")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    ck = Path(base) / "ck"
    df = aks.read_stream_source(
        spark,
        url=url,
        checkpoint=ck,
        stream_port=int(port),
        max_messages_per_trigger=300,
        **{kind: name},
    )
    query = (
        df.select("stream", "offset", "message_id")
        .writeStream.foreachBatch(aks.parquet_batches(Path(base) / "out"))
        .option("checkpointLocation", str(ck))
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    query.awaitTermination()
    return 0


if __name__ == "__main__":
    sys.exit(main())
