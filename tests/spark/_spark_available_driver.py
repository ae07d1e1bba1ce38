"""A Trigger.AvailableNow run of the orders pipeline; also a driver the tests SIGKILL.

    python tests/spark/_spark_available_driver.py URL QUEUE BASE CAP

Reads QUEUE with Trigger.AvailableNow (maxMessagesPerTrigger=CAP) into Parquet under
BASE/out, checkpoint BASE/ck, until the run ends. `ACKKIT_SPARK_CRASH=<point>:<n>` makes
it SIGKILL itself there (see ackkit.spark._faults). Exit code 3: the run ended without
reaching the crash point.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import ackkit.spark as aks  # noqa: E402
from spark.orders_pipeline import Order  # noqa: E402


def start_available_now(
    spark: Any,
    *,
    url: str,
    queue: str,
    base: Path,
    cap: int,
    writer: Callable[[Any, int], None] | None = None,
    **options: Any,
) -> tuple[Any, aks.AckAfterCommit]:
    """Start an AvailableNow query reading `queue` into `base/out`; (query, its wrapper)."""
    ck = base / "ck"
    df = aks.read_stream(
        spark,
        url=url,
        queue=queue,
        checkpoint=ck,
        model=Order,
        maxMessagesPerTrigger=cap,
        **options,
    )
    acking = aks.ack_after_commit(writer or aks.parquet_batches(base / "out"), checkpoint=ck)
    query = aks.start(
        df.select("seq", "message_id", "redelivered", *Order.model_fields)
        .writeStream.queryName(f"available-{queue}")
        .foreachBatch(acking)
        .option("checkpointLocation", os.fspath(ck))
        .trigger(availableNow=True)
    )
    return query, acking


def main() -> int:
    from spark.orders_pipeline import spark_session

    url, queue, base, cap = sys.argv[1], sys.argv[2], Path(sys.argv[3]), int(sys.argv[4])
    spark = spark_session("ackkit-available-driver")
    query, _ = start_available_now(spark, url=url, queue=queue, base=base, cap=cap)
    query.awaitTermination(300)
    return 3


if __name__ == "__main__":
    sys.exit(main())
