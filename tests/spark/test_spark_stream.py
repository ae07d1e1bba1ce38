"""The rabbitmq source and ack_after_commit on a real broker and a local Spark.

What the broker shows is asserted (ready / unacked counts, the DLQ's messages and
headers), and what landed in the Parquet output, not only what the library says.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pika
import pytest
from _spark_support import close_source_connection, dlq_messages, output_ids, wait_for

pytest.importorskip("pyspark")

import ackkit.spark as aks
from spark.orders_pipeline import (
    order_messages,
    publish_orders,
    start_query,
    wait_until_drained,
)

pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.timeout(240)]


class Run:
    """One streaming query of the orders pipeline on a fresh queue and checkpoint."""

    def __init__(self, spark: Any, url: str, queue: str, base: Path, **options: Any) -> None:
        self.spark, self.url, self.queue = spark, url, queue
        self.checkpoint, self.output = base / "ck", base / "out"
        self.query, self.writer = start_query(
            spark,
            url=url,
            queue=queue,
            checkpoint=self.checkpoint,
            output=self.output,
            **options,
        )

    def drain(self, timeout: float = 120.0) -> dict[str, Any]:
        return wait_until_drained(
            self.query,
            url=self.url,
            queue=self.queue,
            checkpoint=self.checkpoint,
            timeout=timeout,
        )

    def stats(self) -> dict[str, Any]:
        return aks.source_stats(self.checkpoint, self.queue)

    def ids(self) -> list[str]:
        return output_ids(self.spark, self.output)

    def stop(self) -> None:
        self.query.stop()


def test_n_messages_make_exactly_n_rows_and_the_queue_drains(
    spark, amqp_url, rabbitmq, queue_factory, tmp_path
):
    q = queue_factory("e2e")
    good, _ = publish_orders(amqp_url, q, 1000)
    run = Run(spark, amqp_url, q, tmp_path, max_batch=300)
    try:
        run.drain()
        # Drained while the query still runs: the last batch is acked without new data.
        counts = rabbitmq.counts(q)
        assert (counts.ready, counts.unacked) == (0, 0)
        assert run.writer.acked == 1000
        assert 4 <= run.writer.batches <= 10  # 1000 rows, at most 300 per batch
        stats = run.stats()
        with_rows = [h for h in run.writer.history if h[3]]
        assert stats["ack_frames"] == len(with_rows), run.writer.history  # one ack per batch
    finally:
        run.stop()
    ids = run.ids()
    assert len(ids) == 1000
    assert sorted(ids) == sorted(good)
    counts = rabbitmq.counts(q)
    assert (counts.ready, counts.unacked, counts.consumers) == (0, 0, 0)


def test_poison_rows_are_dead_lettered_with_their_reason_and_the_rest_commits(
    spark, amqp_url, rabbitmq, queue_factory, tmp_path
):
    q = queue_factory("poison")
    good, bad = publish_orders(amqp_url, q, 300, poison_every=10)
    assert len(bad) == 30
    run = Run(spark, amqp_url, q, tmp_path, max_batch=100)
    try:
        stats = run.drain()
        assert stats["dead_lettered"] == 30
    finally:
        run.stop()
    assert sorted(run.ids()) == sorted(good)
    counts = rabbitmq.counts(q)
    assert (counts.ready, counts.unacked) == (0, 0)
    dead = dlq_messages(amqp_url, f"{q}.dlq")
    assert sorted(mid for mid, _ in dead) == sorted(bad)
    for _mid, headers in dead:
        assert "does not match Order" in headers["ackkit-reason"]
        assert headers["ackkit-original-queue"] == q
        assert headers["ackkit-error-type"].endswith("BadPayload")


def test_idle_query_acks_its_last_batch_and_keeps_its_connection(
    spark, amqp_url, rabbitmq, queue_factory, tmp_path
):
    q = queue_factory("idle")
    publish_orders(amqp_url, q, 10)
    run = Run(spark, amqp_url, q, tmp_path, max_batch=500, heartbeat=1)
    try:
        run.drain()
        # A batch far below max_batch and prefetch, then nothing: acked within a bound.
        publish_orders(amqp_url, q, 40, start=10)
        took = wait_for(
            lambda: (
                rabbitmq.counts(q).unacked == 0
                and rabbitmq.counts(q).ready == 0
                and run.writer.acked == 50
            ),
            timeout=30,
            what="the last batch to be acked while no new data comes",
        )
        assert took < 30
        time.sleep(4.5)  # idle for > 4 heartbeat intervals: the I/O thread keeps it alive
        publish_orders(amqp_url, q, 50, start=50)
        run.drain()
        assert run.stats()["connections"] == 1
        assert run.query.isActive
    finally:
        run.stop()
    assert len(run.ids()) == 100 == len(set(run.ids()))


def test_reconnect_never_acks_a_stale_tag_and_loses_or_repeats_nothing(
    spark, amqp_url, rabbitmq, queue_factory, tmp_path
):
    q = queue_factory("reconnect")
    good, _ = publish_orders(amqp_url, q, 600)
    run = Run(spark, amqp_url, q, tmp_path, max_batch=100)
    try:
        wait_for(lambda: run.writer.batches >= 2, 120, "two batches")
        assert close_source_connection(rabbitmq, q) == 1
        stats = run.drain()
        assert stats["connections"] >= 2
        assert run.query.isActive  # a stale tag would have closed the channel: 406
    finally:
        run.stop()
    ids = run.ids()
    assert sorted(ids) == sorted(good)
    counts = rabbitmq.counts(q)
    assert (counts.ready, counts.unacked) == (0, 0)


def test_stop_leaves_nothing_unacked_and_resume_continues_exactly(
    spark, amqp_url, rabbitmq, queue_factory, tmp_path
):
    q = queue_factory("stop")
    good, _ = publish_orders(amqp_url, q, 600)
    run = Run(spark, amqp_url, q, tmp_path, max_batch=100)
    wait_for(lambda: run.writer.batches >= 2, 120, "two batches")
    run.stop()
    counts = wait_for_counts(rabbitmq, q, lambda c: c.unacked == 0 and c.consumers == 0)
    written = run.ids()
    assert counts.ready == 600 - len(written)  # everything written was acked, the rest is back
    run2 = Run(spark, amqp_url, q, tmp_path, max_batch=100)
    try:
        run2.drain()
    finally:
        run2.stop()
    assert sorted(run2.ids()) == sorted(good)


def test_on_invalid_fail_stops_the_query_and_acks_nothing_of_the_batch(
    spark, amqp_url, rabbitmq, queue_factory, tmp_path
):
    q = queue_factory("fail")
    publish_orders(amqp_url, q, 20, poison_every=20)  # the 20th is malformed
    run = Run(spark, amqp_url, q, tmp_path, max_batch=100, dead_letter=False)
    try:
        with pytest.raises(Exception, match="does not validate"):
            run.query.awaitTermination(120)
    finally:
        run.stop()
    counts = wait_for_counts(rabbitmq, q, lambda c: c.consumers == 0 and c.unacked == 0)
    assert counts.ready == 20
    assert run.ids() == []


def test_a_forged_attempt_header_is_dead_lettered_by_the_core_even_with_on_invalid_fail(
    spark, amqp_url, rabbitmq, queue_factory, tmp_path
):
    q = queue_factory("forged")
    good, _ = publish_orders(amqp_url, q, 20)
    conn = pika.BlockingConnection(pika.URLParameters(amqp_url))
    try:
        body = next(order_messages(1, start=99))[1]
        props = pika.BasicProperties(message_id="forged", headers={"ackkit-attempt": "lots"})
        conn.channel().basic_publish("", q, body, props)
    finally:
        conn.close()
    run = Run(spark, amqp_url, q, tmp_path, max_batch=100, dead_letter=False)
    try:
        run.drain()
    finally:
        run.stop()
    assert sorted(run.ids()) == sorted(good)
    dead = dlq_messages(amqp_url, f"{q}.dlq")  # declared on its first use
    assert [mid for mid, _ in dead] == ["forged"]
    assert "ackkit-attempt" in dead[0][1]["ackkit-reason"]
    counts = rabbitmq.counts(q)
    assert (counts.ready, counts.unacked) == (0, 0)


def test_a_failing_writer_acks_nothing_and_a_restart_writes_everything_once(
    spark, amqp_url, rabbitmq, queue_factory, tmp_path
):
    q = queue_factory("writer_fails")
    good, _ = publish_orders(amqp_url, q, 300)
    plain = aks.parquet_batches(tmp_path / "out")

    def flaky(df: Any, batch_id: int) -> None:
        if batch_id == 1:
            raise RuntimeError("disk full (test)")
        plain(df, batch_id)

    run = Run(spark, amqp_url, q, tmp_path, max_batch=100, writer=flaky)
    try:
        with pytest.raises(Exception, match="disk full"):
            run.query.awaitTermination(120)
    finally:
        run.stop()
    assert run.writer.batches == 1 and run.writer.acked == len(run.ids()) == 100
    # Batch 1 was not acked: with the runner gone, it is back in the queue.
    counts = wait_for_counts(rabbitmq, q, lambda c: c.consumers == 0 and c.unacked == 0)
    assert counts.ready == 200
    run2 = Run(spark, amqp_url, q, tmp_path, max_batch=100)
    try:
        run2.drain()
    finally:
        run2.stop()
    assert sorted(run2.ids()) == sorted(good)


def wait_for_counts(broker: Any, queue: str, ok: Any, timeout: float = 60.0) -> Any:
    # 60 s: a loaded CI rehearsal (two Spark JVMs on 2 cores) once took over 30 s to
    # get there after query.stop(); the counts seen last are in the failure
    last = None

    def check() -> bool:
        nonlocal last
        last = broker.counts(queue)
        return bool(ok(last))

    try:
        wait_for(check, timeout, f"counts of {queue}")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; last counts: {last}") from None
    return last
