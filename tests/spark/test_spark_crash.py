"""Exactly-once effect under crashes: SIGKILL the driver, restart on the same checkpoint.

Every scenario runs the orders pipeline in a driver subprocess that kills itself at one
point (all scenarios start together, to share the JVM start-up time), then restarts the
query on the same checkpoint in this process's SparkSession and checks what the broker
and the output show: every order exactly once, the queue drained.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pika
import pytest
from _spark_support import output_ids

pytest.importorskip("pyspark")

import contextlib

from ackkit.spark._faults import ENV
from spark.orders_pipeline import publish_orders, start_query, wait_until_drained

pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.timeout(600)]

N = 300
MAX_BATCH = 100
DRIVER = Path(__file__).with_name("_spark_crash_driver.py")

SCENARIOS = {
    # name: (crash point, redelivered copies the restarted source must recognise)
    "after_write": ("after_write:1", MAX_BATCH),  # written, not acked
    "mid_write": ("mid_write:1", MAX_BATCH),  # killed while Spark writes the batch
    "after_ack": ("after_ack:1", 0),  # acked, Spark's commit log not written
    "wal_written": ("wal_written:2", MAX_BATCH),  # logged by the source, not by Spark
}


@dataclass
class Crashed:
    queue: str
    base: Path
    good: list[str]
    returncode: int
    log: str


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def crashed(amqp_url: str, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Run every crash scenario's driver at once; yield {name: Crashed}."""
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable)
    procs = {}
    setup: dict[str, tuple[str, Path, list[str]]] = {}
    for name, (spec, _held) in SCENARIOS.items():
        queue = f"t.spark_crash.{name}.{secrets.token_hex(3)}"
        base = tmp_path_factory.mktemp(f"crash-{name}")
        good, _bad = publish_orders(amqp_url, queue, N)
        setup[name] = (queue, base, good)
        logf = open(base / "driver.log", "wb")  # noqa: SIM115 - closed below
        procs[name] = (
            subprocess.Popen(
                [sys.executable, str(DRIVER), amqp_url, queue, str(base), str(MAX_BATCH)],
                env={**env, ENV: spec},
                stdout=logf,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            ),
            logf,
        )
    results = {}
    deadline = time.monotonic() + 300
    try:
        for name, (proc, logf) in procs.items():
            try:
                rc = proc.wait(timeout=max(deadline - time.monotonic(), 1))
            except subprocess.TimeoutExpired:
                rc = None
            _kill_group(proc)  # the JVM and the source runner go down with the driver
            logf.close()
            queue, base, good = setup[name]
            log = (base / "driver.log").read_text(errors="replace")[-3000:]
            results[name] = Crashed(queue, base, good, -999 if rc is None else rc, log)
        yield results
    finally:
        for proc, logf in procs.values():
            _kill_group(proc)
            logf.close()
        conn = pika.BlockingConnection(pika.URLParameters(amqp_url))
        try:
            ch = conn.channel()
            for queue, _base, _good in setup.values():
                ch.queue_delete(queue)
                ch.queue_delete(f"{queue}.dlq")
        finally:
            conn.close()


@dataclass
class Recovered:
    crashed: Crashed
    before: list[str]
    ids: list[str]
    ready: int
    unacked: int
    copies: int
    error: str | None


@pytest.fixture(scope="module")
def recovered(crashed: dict[str, Crashed], spark: Any, amqp_url: str, rabbitmq: Any) -> Any:
    """Restart every crashed query on its checkpoint, one after the other."""
    out = {}
    for name, c in crashed.items():
        if c.returncode != -signal.SIGKILL:
            continue
        before = output_ids(spark, c.base / "out")
        query, _writer = start_query(
            spark,
            url=amqp_url,
            queue=c.queue,
            checkpoint=c.base / "ck",
            output=c.base / "out",
            max_batch=MAX_BATCH,
        )
        error, stats = None, {}
        try:
            stats = wait_until_drained(
                query, url=amqp_url, queue=c.queue, checkpoint=c.base / "ck", timeout=180
            )
        except (RuntimeError, TimeoutError) as exc:
            error = str(exc)[:3000]
        finally:
            query.stop()
        counts = rabbitmq.counts(c.queue)
        out[name] = Recovered(
            c,
            before,
            output_ids(spark, c.base / "out"),
            counts.ready,
            counts.unacked,
            int(stats.get("copies", -1)),
            error,
        )
    return out


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_restart_after_sigkill_writes_every_message_exactly_once(scenario, crashed, recovered):
    c: Crashed = crashed[scenario]
    assert c.returncode == -signal.SIGKILL, f"driver did not die at its crash point:\n{c.log}"
    r: Recovered = recovered[scenario]
    assert r.error is None, r.error
    assert len(r.before) < N and len(set(r.before)) == len(r.before)
    assert len(r.ids) == N, f"{len(r.ids) - len(set(r.ids))} duplicates"
    assert sorted(r.ids) == sorted(c.good)
    assert (r.ready, r.unacked) == (0, 0)
    # The batch that was cut short came back from the write-ahead log, and the broker's
    # redelivered copies of it were recognised and acked with it, not written again.
    assert r.copies == SCENARIOS[scenario][1]
