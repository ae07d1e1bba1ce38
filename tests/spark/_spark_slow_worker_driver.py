"""A Spark driver whose source runner starts slower than Spark waits for it (the
`_slow_worker/sitecustomize.py` on its PYTHONPATH): starts the deployment tests' query
(`_spark_deploy_query.start`) and runs it until drained.

    python tests/spark/_spark_slow_worker_driver.py URL QUEUE BASE

Prints one JSON line: {"ok": true} or {"ok": false, "error": "..."}."""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))
sys.path.insert(0, str(HERE))

from _spark_deploy_query import start  # noqa: E402

from spark import orders_pipeline as op  # noqa: E402


def main() -> int:
    url, queue, base = sys.argv[1:4]
    spark = op.spark_session("ackkit-slow-worker")
    try:
        query = start(spark, url, base, queues=[queue])
        op.wait_until_drained(
            query, url=url, queue=[queue], checkpoint=Path(base) / "ck", timeout=180
        )
        query.stop()
        print(json.dumps({"ok": True}))
    except Exception as exc:
        print(json.dumps({"ok": False, "error": str(exc)[:2000]}))
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
