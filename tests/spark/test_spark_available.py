"""Trigger.AvailableNow on a real broker and a local Spark: read what is there, then stop.

A run reads the messages the queue held when it started, in batches of at most
maxMessagesPerTrigger, acks each after its write, and ends by itself; messages published
during the run stay in the queue for the next run. A run SIGKILLed half-way (its driver
process, as the crash tests do) and run again on the same checkpoint writes every
message exactly once. Asserted on what the broker and the output show.

The killed driver starts with the module (its JVM start-up overlaps the first test).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pytest
from _spark_available_driver import start_available_now
from _spark_support import output_ids, wait_for

pytest.importorskip("pyspark")

from ackkit.spark import batch_offsets, parquet_batches
from ackkit.spark._faults import ENV
from spark.orders_pipeline import publish_orders

pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.timeout(600)]

DRIVER = Path(__file__).with_name("_spark_available_driver.py")
CAP = 100


def _ends(checkpoint: Path) -> list[int]:
    """The source's end offset of every batch in the checkpoint's offsets log, in order."""
    ids = sorted(int(n) for n in os.listdir(checkpoint / "offsets") if n.isdigit())
    return [e for i in ids for _q, e in batch_offsets(checkpoint, i)]


def _sizes(ends: list[int], start: int = 0) -> list[int]:
    out, prev = [], start
    for e in ends:
        out.append(e - prev)
        prev = e
    return out


def _finished(query: Any, timeout: float = 240) -> None:
    """The AvailableNow query ends by itself (no stop())."""
    done = query.awaitTermination(timeout)
    if not done:
        query.stop()
    assert done, f"the AvailableNow query did not end within {timeout} s: {query.lastProgress}"
    assert query.exception() is None, query.exception()


@pytest.fixture(scope="module")
def killed(amqp_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A driver running an AvailableNow query that SIGKILLs itself after writing batch 2
    (written, not acked, not committed), started now; yields its setup once it died."""
    queue = f"t.spark_avail.kill.{secrets.token_hex(3)}"
    base = tmp_path_factory.mktemp("avail-kill")
    good, _ = publish_orders(amqp_url, queue, 5 * CAP)
    logf = open(base / "driver.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [sys.executable, str(DRIVER), amqp_url, queue, str(base), str(CAP)],
        env={**os.environ, "PYSPARK_PYTHON": sys.executable, ENV: "after_write:2"},
        stdout=logf,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    info: dict[str, Any] = {"queue": queue, "base": base, "good": good, "proc": proc}
    try:
        yield info
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        logf.close()
        conn = pika.BlockingConnection(pika.URLParameters(amqp_url))
        try:
            conn.channel().queue_delete(queue)
        finally:
            conn.close()


def test_a_run_reads_what_was_there_in_capped_batches_and_the_next_run_the_rest(
    spark, amqp_url, rabbitmq, queue_factory, tmp_path, killed
):
    q = queue_factory("avail")
    n, later = 3 * CAP + 50, 40
    good, _ = publish_orders(amqp_url, q, n)
    published: list[str] = []

    def writer(df: Any, batch_id: int) -> None:
        if not published:  # the run has counted the queue: these are for the next run
            published.extend(publish_orders(amqp_url, q, later, start=n)[0])
        plain(df, batch_id)

    plain = parquet_batches(tmp_path / "out")
    query, acking = start_available_now(
        spark, url=amqp_url, queue=q, base=tmp_path, cap=CAP, writer=writer
    )
    _finished(query)
    ids = output_ids(spark, tmp_path / "out")
    assert sorted(ids) == sorted(good)  # exactly what was there: none later, none twice
    sizes = [s for s in _sizes(_ends(tmp_path / "ck")) if s]
    assert sum(sizes) == n and max(sizes) <= CAP and len(sizes) >= 4, sizes
    assert acking.acked == n
    # The later messages wait in the queue; the run's connection is gone.
    wait_for(
        lambda: (lambda c: (c.ready, c.unacked, c.consumers) == (later, 0, 0))(rabbitmq.counts(q)),
        60,
        "the later messages back in the queue, no consumer",
    )
    # The next run on the same checkpoint reads exactly those.
    query, acking = start_available_now(spark, url=amqp_url, queue=q, base=tmp_path, cap=CAP)
    _finished(query)
    ids = output_ids(spark, tmp_path / "out")
    assert len(ids) == len(set(ids)) and sorted(ids) == sorted(good + published)
    assert acking.acked == later
    wait_for(
        lambda: (lambda c: (c.ready, c.unacked, c.consumers) == (0, 0, 0))(rabbitmq.counts(q)),
        60,
        "the queue drained",
    )


def test_a_run_killed_half_way_and_run_again_writes_every_message_once(
    spark, amqp_url, rabbitmq, killed
):
    proc: subprocess.Popen[bytes] = killed["proc"]
    base: Path = killed["base"]
    try:
        rc = proc.wait(timeout=300)
    except subprocess.TimeoutExpired:
        rc = None
    log = (base / "driver.log").read_text(errors="replace")[-3000:]
    assert rc == -signal.SIGKILL, f"the driver did not die at its crash point ({rc}):\n{log}"
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)  # its JVM and source runner with it
    before = output_ids(spark, base / "out")
    assert 0 < len(before) < len(killed["good"])  # killed half-way
    t0 = time.monotonic()
    query, _acking = start_available_now(
        spark, url=amqp_url, queue=killed["queue"], base=base, cap=CAP
    )
    _finished(query)
    ids = output_ids(spark, base / "out")
    assert len(ids) == len(set(ids)), f"{len(ids) - len(set(ids))} duplicates"
    assert sorted(ids) == sorted(killed["good"])
    wait_for(
        lambda: (lambda c: (c.ready, c.unacked))(rabbitmq.counts(killed["queue"])) == (0, 0),
        60,
        f"the queue drained (rerun took {time.monotonic() - t0:.0f} s)",
    )
