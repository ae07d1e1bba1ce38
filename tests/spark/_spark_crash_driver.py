"""A Spark driver the crash tests SIGKILL: runs the orders pipeline until drained.

    python tests/spark/_spark_crash_driver.py URL QUEUE BASE MAX_BATCH [SHARDS [WAL]]

SHARDS > 0 reads the client-routed shard queues of QUEUE in parallel; WAL is the
write-ahead log's location (e.g. an s3:// URI) when not inside the checkpoint.

`ACKKIT_SPARK_CRASH=<point>:<n>` picks the crash point (see ackkit.spark._faults);
`mid_write:<batch>` is this script's own: the process kills itself while Spark is
writing that batch's Parquet files. `ACKKIT_SPARK_CONF=<JSON object>`: Spark settings
over the local defaults (e.g. a standalone cluster's, see `_spark_cluster.py`). Exit
code 3: drained without reaching the point.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from ackkit.spark import ShardKind, ShardLayout, parquet_batches  # noqa: E402
from ackkit.spark._faults import ENV  # noqa: E402
from spark import orders_pipeline as op  # noqa: E402

CONF_ENV = "ACKKIT_SPARK_CONF"


def main() -> int:
    url, queue, base, max_batch = sys.argv[1], sys.argv[2], Path(sys.argv[3]), int(sys.argv[4])
    shards = int(sys.argv[5]) if len(sys.argv) > 5 else 0
    options = {"wal_location": sys.argv[6]} if len(sys.argv) > 6 and sys.argv[6] else {}
    layout = ShardLayout(queue, shards, ShardKind.CLIENT) if shards else None
    point, _, num = os.environ.get(ENV, "").partition(":")
    writer = None
    if point == "mid_write":
        del os.environ[ENV]
        target = int(num)
        plain = parquet_batches(base / "out")

        def killing_writer(df: object, batch_id: int) -> None:
            if batch_id == target:
                # Spark is inside the write job when this fires.
                threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGKILL)).start()
            plain(df, batch_id)
            if batch_id == target:
                time.sleep(5)  # not reached in time: still dies before the ack

        writer = killing_writer
    conf = json.loads(os.environ.get(CONF_ENV) or "{}")
    spark = op.spark_session("ackkit-crash-driver", conf=conf)
    query, _writer = op.start_query(
        spark,
        url=url,
        queue=queue,
        checkpoint=base / "ck",
        output=base / "out",
        max_batch=max_batch,
        writer=writer,
        layout=layout,
        **options,
    )
    queues = layout.queues if layout else queue
    op.wait_until_drained(query, url=url, queue=queues, checkpoint=base / "ck", timeout=300)
    query.stop()
    return 3


if __name__ == "__main__":
    sys.exit(main())
