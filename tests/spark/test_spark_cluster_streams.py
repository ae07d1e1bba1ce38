"""The stream source on a Spark standalone cluster: its reads run in executor processes of
their own, and one of those is SIGKILLed mid-query.

`test_spark_cluster.py` does this for the queue source (whose runners live on the driver's
host). The stream source plans offset ranges on the driver and reads them on executors
with rstream, so here an executor JVM that may be reading is SIGKILLed at a random moment
(the worker starts another; Spark retries the task), then the whole driver, and a new
driver on the same checkpoint reads to the end. The output must hold every record of the
stream exactly once, compared with what plain rstream reads back. A plain stream on
3.10 (one input partition), a super stream of 3 partitions on 3.11+ (make test runs it on
the 4.3 leg). The checkpoint's offsets must then be each partition's end. In make soak
(ACKKIT_FUZZ), the deployment then changes while the query is down (a fourth partition,
more records in every partition) and the next driver reads exactly what is new. The
moments come from a seed, printed: ACKKIT_SPARK_KILL_SEED=<seed> draws them again.
"""

from __future__ import annotations

import json
import os
import random
import secrets
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pika
import pytest
from _spark_cluster import SparkCluster

pytest.importorskip("pyspark")
pytest.importorskip("rstream")

import pyarrow.parquet as pq

from spark.orders_pipeline import REPO_ROOT
from spark.random_kill import kill_rounds
from tests._streams import (
    declare_stream,
    declare_super_stream,
    delete_queues,
    last_offsets,
    message_ids,
    publish,
    version_of,
)

pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.timeout(600)]

N = 3000
MORE = 600  # after the deployment change
DRIVER = Path(__file__).with_name("_spark_streams_driver.py")
FIXED_SEED = 20261126


def test_executor_and_driver_sigkilled_stream_output_is_exactly_once(
    spark_cluster: SparkCluster, stream_broker: Any, tmp_path: Path
) -> None:
    node = stream_broker
    given = os.environ.get("ACKKIT_SPARK_KILL_SEED")
    fuzz = os.environ.get("ACKKIT_FUZZ")
    seed = int(given) if given else random.SystemRandom().randrange(2**32) if fuzz else FIXED_SEED
    rng = random.Random(seed)
    print(f"cluster streams kill seed {seed} (rerun: ACKKIT_SPARK_KILL_SEED={seed})")
    name = f"t.cluster-stream.{secrets.token_hex(3)}"
    if version_of(node.url) >= (3, 11):
        kind, parts = "super_stream", declare_super_stream(node.url, name, 3)
    else:
        kind, parts = "stream", [name]
        declare_stream(node.url, name)
    try:
        for i, part in enumerate(parts):
            ids = range(i, N, len(parts))
            publish(node.url, node.stream_port, part, [(f"r-{k:06d}", b"x") for k in ids])

        # What executors get, as a deployment would send it: this checkout's ackkit only.
        lib = tmp_path / "executor-path"
        lib.mkdir()
        (lib / "ackkit").symlink_to(REPO_ROOT / "ackkit")
        conf = spark_cluster.session_conf(executor_env={"PYTHONPATH": str(lib)})
        env = dict(os.environ, PYSPARK_PYTHON=sys.executable, ACKKIT_SPARK_CONF=json.dumps(conf))
        cmd = [sys.executable, str(DRIVER), node.url, str(node.stream_port), kind, name]
        cmd += [str(tmp_path), str(N)]
        kills: list[dict[str, Any]] = []
        kill_an_executor = spark_cluster.executor_killer(rng, 2, kills)

        t0 = time.monotonic()
        driver_kills, last_exit = kill_rounds(
            cmd, env, tmp_path, rng, kills=1, min_s=1.0, max_s=4.0, timeout=300,
            on_write=kill_an_executor,
        )  # fmt: skip
        seconds = time.monotonic() - t0
        why = f"seed {seed}, driver kills {driver_kills}, executor kills {kills}\n"
        why += _logs(tmp_path)
        assert last_exit == 3, f"the last driver did not read to the end: {why}"
        assert driver_kills == 1, f"the driver read everything before its kill: {why}"
        assert [k["round"] for k in kills] == [0, 1], why
        assert all(k["driver_running"] for k in kills), why
        _exactly_once(node, parts, tmp_path, N, why)

        # A deployment change while the query is down: a fourth partition (super stream)
        # and more records everywhere; the next driver reads to the end on the same
        # checkpoint. make soak only (ACKKIT_FUZZ): another Spark start-up on the cluster
        # (a minute or more of make test), and test_spark_streams_kill.py adds a
        # partition under a checkpoint and kills the driver after it in make test.
        if not fuzz:
            print(
                f"FIG cluster streams: {kind} of {len(parts)} partitions, {N} records exactly "
                f"once; {seconds:.0f} s, seed {seed}, executor kills {kills}, driver kills "
                f"{driver_kills}"
            )
            return
        if kind == "super_stream":
            parts += declare_super_stream(node.url, name, 1, first=3)
        for i, part in enumerate(parts):
            ids = range(N + i, N + MORE, len(parts))
            publish(node.url, node.stream_port, part, [(f"r-{k:06d}", b"x") for k in ids])
        again, again_exit = kill_rounds(
            [*cmd[:-1], str(N + MORE)], env, tmp_path, rng, kills=0, timeout=300
        )
        why = f"seed {seed}, after the change: driver kills {again}\n" + _logs(tmp_path)
        assert again_exit == 3, f"the last driver did not read to the end: {why}"
        _exactly_once(node, parts, tmp_path, N + MORE, why)
        print(
            f"FIG cluster streams: {kind} of {len(parts)} partitions, {N + MORE} records exactly "
            f"once; first part {seconds:.0f} s, seed {seed}, executor kills {kills}, driver "
            f"kills {driver_kills}, then a partition added and read in a new driver ({again} kills)"
        )
    finally:
        delete_queues(node.url, *parts)
        if kind == "super_stream":
            conn = pika.BlockingConnection(pika.URLParameters(node.url))
            try:
                conn.channel().exchange_delete(name)
            finally:
                conn.close()


def _exactly_once(node: Any, parts: list[str], base: Path, n: int, why: str) -> None:
    """The output holds every record of the partitions once (as plain rstream reads them)
    and the checkpoint's last offsets are each partition's end."""
    got = pq.read_table(base / "out", columns=["message_id"]).column(0).to_pylist()
    dups = [m for m, c in Counter(got).items() if c > 1]
    assert not dups, f"{len(dups)} duplicated, e.g. {dups[:3]}; {why}"
    per_part = {p: message_ids(node.url, node.stream_port, p, timeout=2.0) for p in parts}
    in_stream = [m for ids in per_part.values() for m in ids]
    assert len(in_stream) == n
    assert sorted(got) == sorted(in_stream), why
    assert last_offsets(base / "ck") == {p: len(ids) for p, ids in per_part.items()}, why


def _logs(base: Path, tail: int = 3000) -> str:
    return "\n".join(
        f"--- {f.name}\n{f.read_text(errors='replace')[-tail:]}"
        for f in sorted(base.glob("driver-*.log"))
    )
