"""A Spark driver the deployment tests SIGKILL (`ACKKIT_SPARK_CRASH`, see
ackkit.spark._faults): runs `_spark_deploy_query.start(**SPEC)` until drained.

    python tests/spark/_spark_deploy_driver.py SPEC_JSON

Exit code 3: drained without reaching the crash point."""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))
sys.path.insert(0, str(HERE))

from _spark_deploy_query import start  # noqa: E402

from ackkit.spark import shard_queues  # noqa: E402
from spark import orders_pipeline as op  # noqa: E402


def main() -> int:
    spec = json.loads(sys.argv[1])
    spark = op.spark_session("ackkit-deploy-driver")
    query = start(spark, **spec)
    queues = spec.get("queues") or list(shard_queues(spec["exchange"], spec["shards"]))
    ck = Path(spec["base"]) / spec.get("ck", "ck")
    op.wait_until_drained(query, url=spec["url"], queue=queues, checkpoint=ck, timeout=300)
    query.stop()
    return 3


if __name__ == "__main__":
    sys.exit(main())
