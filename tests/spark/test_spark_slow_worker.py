"""A machine too busy to start Spark's source runner in time: the query starts anyway.

Spark waits a fixed 10 s for the Python process it starts per source to connect back
(not configurable in Spark 4.3) and fails the query with "Python worker failed to
connect back" when it is late. Here the runner's interpreter sleeps 12 s at start-up, the
first time only (`_slow_worker/sitecustomize.py`), in a driver process of its own:
`aks.start` starts the query again, and every message ends in the output once with the
queue empty."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")

from spark.orders_pipeline import publish_orders

pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.timeout(600)]

HERE = Path(__file__).resolve().parent
DRIVER = HERE / "_spark_slow_worker_driver.py"
RUNNER = "pyspark.sql.streaming.python_streaming_source_runner"
LATE = 12  # seconds: past Spark's fixed 10 s


def test_a_source_runner_that_misses_the_connect_back_is_started_again(
    amqp_url: str, queue_factory: Any, rabbitmq: Any, spark: Any, tmp_path: Path
) -> None:
    q = queue_factory("slow-runner")
    good, _ = publish_orders(amqp_url, q, 60)
    slow = tmp_path / "slow-starts"
    path = [str(HERE / "_slow_worker"), str(HERE.parents[1]), os.environ.get("PYTHONPATH", "")]
    env = dict(
        os.environ,
        PYSPARK_PYTHON=sys.executable,
        PYTHONPATH=os.pathsep.join(p for p in path if p),
        ACKKIT_TEST_SLOW_WORKER=f"{RUNNER}:{LATE}:{slow}:1",
    )
    run = subprocess.run(
        [sys.executable, str(DRIVER), amqp_url, q, str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=480,
    )
    lines = [ln for ln in run.stdout.splitlines() if ln.startswith("{")]
    assert lines, f"the driver printed no result (exit {run.returncode}):\n{run.stderr[-3000:]}"
    result = json.loads(lines[-1])
    # The runner was late once, as set up: Spark gave up on it.
    assert len(slow.read_text().splitlines()) == 1
    assert result["ok"], result["error"]
    out = tmp_path / "out-ck"
    ids = [r["message_id"] for r in spark.read.parquet(str(out)).select("message_id").collect()]
    assert sorted(ids) == sorted(good)
    counts = rabbitmq.counts(q)
    assert (counts.ready, counts.unacked) == (0, 0)
