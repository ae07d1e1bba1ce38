"""The source on a Spark standalone cluster: executors in JVMs and processes of their own.

Every other Spark test runs its executors inside the driver's JVM (local[2]). Here a
master and two workers (1 core each, `_spark_cluster.py`) run on loopback, and the orders
pipeline reads two shard queues with their write-ahead logs on the S3-compatible test
server (Spark's own checkpoint stays on the local disk: pip's pyspark has no s3a://). A
replayed batch is then read back from S3 by an executor's Python worker in another JVM,
with only the environment the application sent it.

The driver (`_spark_crash_driver.py`: its Python, its JVM and the source runners) is
SIGKILLed at a random moment after it wrote a batch and restarted on the same checkpoint;
in each run one executor JVM is SIGKILLed at a random moment while the driver is alive
(the worker starts another). Then the output holds every order exactly once and the
broker shows every shard queue empty with nothing unacked. The moments come from a seed,
printed (and in every failure message): ACKKIT_SPARK_KILL_SEED=<seed> draws them again;
`make test` uses a fixed one, `make fuzz` (ACKKIT_FUZZ) a fresh one.
"""

from __future__ import annotations

import json
import os
import random
import secrets
import sys
import time
from pathlib import Path
from typing import Any

import pika
import pytest
from _spark_cluster import SparkCluster
from _spark_support import wait_for

pytest.importorskip("pyspark")

import pyarrow.parquet as pq

from ackkit.spark import ShardKind, declare_shards
from ackkit.spark._options import wal_dir
from ackkit.spark._store import Store, child_location
from spark.orders_pipeline import REPO_ROOT, publish_orders
from spark.random_kill import kill_rounds

pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.timeout(600)]

N = 3000
SHARDS = 2
MAX_BATCH = 100  # per shard queue: ~15 batches, so that the kills land mid-stream
DRIVER = Path(__file__).with_name("_spark_crash_driver.py")
FIXED_SEED = 20261126


def kill_seed() -> int:
    given = os.environ.get("ACKKIT_SPARK_KILL_SEED")
    if given:
        return int(given)
    return random.SystemRandom().randrange(2**32) if os.environ.get("ACKKIT_FUZZ") else FIXED_SEED


def test_driver_and_executor_sigkilled_on_a_cluster_output_equals_input(
    spark_cluster: SparkCluster, amqp_url: str, rabbitmq: Any, s3_base: str, tmp_path: Path
):
    seed = kill_seed()
    rng = random.Random(seed)
    print(f"cluster kill seed {seed} (rerun: ACKKIT_SPARK_KILL_SEED={seed})")
    name = f"t.spark_cluster.{secrets.token_hex(3)}"
    layout = declare_shards(amqp_url, name, SHARDS, kind=ShardKind.CLIENT)
    wal = child_location(s3_base, f"cluster-{name}")
    try:
        good, _bad = publish_orders(amqp_url, name, N, layout=layout)
        published = {q: rabbitmq.counts(q).ready for q in layout.queues}
        assert sum(published.values()) == N and all(published.values()), published

        # What executors get, as a deployment would send it: this checkout's ackkit (a
        # directory holding only it: the model's module, spark.orders_pipeline, stays on
        # the driver host) and the object store's credentials; nothing else of ours.
        creds = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_EC2_METADATA_DISABLED")
        lib = tmp_path / "executor-path"
        lib.mkdir()
        (lib / "ackkit").symlink_to(REPO_ROOT / "ackkit")
        executor_env = {"PYTHONPATH": str(lib)}
        executor_env.update({k: os.environ[k] for k in creds if k in os.environ})
        conf = spark_cluster.session_conf(executor_env=executor_env)
        env = dict(os.environ, PYSPARK_PYTHON=sys.executable, ACKKIT_SPARK_CONF=json.dumps(conf))
        cmd = [sys.executable, str(DRIVER), amqp_url, name, str(tmp_path), str(MAX_BATCH)]
        cmd += [str(SHARDS), wal]

        kills: list[dict[str, Any]] = []
        kill_an_executor = spark_cluster.executor_killer(rng, SHARDS, kills, idle_max=2.0)

        t0 = time.monotonic()
        driver_kills, last_exit = kill_rounds(
            cmd, env, tmp_path, rng, kills=1, min_s=1.0, max_s=5.0, timeout=300,
            on_write=kill_an_executor,
        )  # fmt: skip
        seconds = time.monotonic() - t0
        why = (
            f"seed {seed}, driver kills {driver_kills}, executor kills {kills}\n"
            + _logs(tmp_path)
            + spark_cluster.logs()
        )
        assert last_exit == 3, f"the last driver did not drain the queues: {why}"
        assert driver_kills == 1, f"the driver drained before its kill: {why}"
        assert [k["round"] for k in kills] == [0, 1], why
        assert all(k["driver_running"] for k in kills), why

        # Exactly once: every order in the output, none twice; each shard queue's share.
        table = pq.read_table(tmp_path / "out", columns=["message_id", "queue"])
        ids = table.column("message_id").to_pylist()
        assert len(ids) == len(set(ids)) == N, f"{len(ids) - len(set(ids))} duplicates: {why}"
        assert sorted(ids) == sorted(good), why
        per_queue = {q: table.column("queue").to_pylist().count(q) for q in layout.queues}
        assert per_queue == published, why
        # The broker: every shard queue drained, nothing unacked, nothing dead-lettered.
        for q in layout.queues:
            c = rabbitmq.counts(q)
            assert (c.ready, c.unacked) == (0, 0), f"{q}: {c}; {why}"
            assert _ready(amqp_url, f"{q}.dlq") == 0, why
        # The write-ahead logs were on the object store, not on the local disk.
        assert not (tmp_path / "ck" / "ackkit").exists()
        for q in layout.queues:
            names = Store(wal_dir(str(tmp_path / "ck"), q, wal)).names()
            assert any(n.startswith("written-") for n in names), names
        # The application gone, the workers stopped its executors (none left running).
        wait_for(lambda: not spark_cluster.executors(), 60, "the executors to stop")
        print(
            f"cluster kill run: seed {seed}, {seconds:.0f} s, driver kills {driver_kills}, "
            f"executor kills {kills}, batches replayed after the driver kill: "
            f"{_replayed(tmp_path / 'ck', [k['driver_killed_at'] for k in kills])}"
        )
    finally:
        conn = pika.BlockingConnection(pika.URLParameters(amqp_url))
        try:
            ch = conn.channel()
            for q in layout.queues:
                ch.queue_delete(q)
                ch.queue_delete(f"{q}.dlq")
        finally:
            conn.close()


def _ready(url: str, queue: str) -> int:
    """Ready messages in `queue` (0 when it does not exist)."""
    conn = pika.BlockingConnection(pika.URLParameters(url))
    try:
        return int(conn.channel().queue_declare(queue, passive=True).method.message_count)
    except pika.exceptions.ChannelClosedByBroker:
        return 0
    finally:
        if conn.is_open:
            conn.close()


def _replayed(ck: Path, killed_at: list[float | None]) -> list[int]:
    """Batches the killed driver had planned (Spark's offsets log) and the restarted one
    committed: replayed, read back from the write-ahead log by an executor (for the
    report: the kill moment is known to a fraction of a second)."""
    if not killed_at or killed_at[0] is None:
        return []
    out = []
    for p in (ck / "offsets").iterdir():
        done = ck / "commits" / p.name
        if (
            p.name.isdigit()
            and done.exists()
            and p.stat().st_mtime < killed_at[0] < done.stat().st_mtime
        ):
            out.append(int(p.name))
    return sorted(out)


def _logs(base: Path, tail: int = 3000) -> str:
    out = []
    for f in sorted(base.glob("driver-*.log")):
        out.append(f"--- {f.name}\n{f.read_text(errors='replace')[-tail:]}")
    return "\n".join(out)
