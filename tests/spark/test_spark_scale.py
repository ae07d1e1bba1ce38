"""Beyond one queue and one disk: shard queues read in parallel, the log on object storage.

What the broker shows (every shard queue drained, nothing unacked), what the output holds
(every order once, each from the shard its key routes to, one customer's orders in
publish order) and where the write-ahead log went (objects on an S3-compatible server
started on 127.0.0.1 by the tests) are asserted.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from _spark_support import output_ids

pytest.importorskip("pyspark")

import ackkit.spark as aks
from ackkit.spark._store import Store, child_location
from spark.orders_pipeline import publish_orders, start_query, wait_until_drained

pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.timeout(300)]


def _read_all_shards(
    spark: Any, amqp_url: str, rabbitmq: Any, layout: Any, tmp_path: Any, n: int, **kw: Any
) -> tuple[dict[str, Any], list[Any], list[str]]:
    """Publish `n` orders through `layout`, run a query over its shards until they are
    drained, and check what the broker shows: every shard queue left empty, each queue's
    share of every batch acked by its own runner, all of it once. Returns the drain
    stats, the output rows and the published message ids."""
    good, _ = publish_orders(amqp_url, layout.name, n, layout=layout)
    per_queue = {q: rabbitmq.counts(q).ready for q in layout.queues}
    assert sum(per_queue.values()) == n and all(per_queue.values()), per_queue
    query, writer = start_query(
        spark,
        url=amqp_url,
        queue=layout.name,
        checkpoint=tmp_path / "ck",
        output=tmp_path / "out",
        max_batch=100,
        layout=layout,
        **kw,
    )
    try:
        stats = wait_until_drained(
            query, url=amqp_url, queue=layout.queues, checkpoint=tmp_path / "ck", timeout=180
        )
        for q in layout.queues:
            c = rabbitmq.counts(q)
            assert (c.ready, c.unacked) == (0, 0), q
    finally:
        query.stop()
    acked = {q: sum(h[3] for h in writer.history if h[1] == q) for q in layout.queues}
    assert acked == per_queue
    rows = (
        spark.read.parquet(str(tmp_path / "out"))
        .select("queue", "seq", "message_id", "customer")
        .collect()
    )
    assert sorted(r["message_id"] for r in rows) == sorted(good)  # every order, once
    return stats, rows, good


def test_shard_queues_are_read_in_parallel_each_message_once_and_per_key_in_order(
    spark, amqp_url, rabbitmq, queue_factory, tmp_path
):
    name = queue_factory("shards")
    layout = aks.declare_shards(amqp_url, name, 2, kind=aks.ShardKind.CLIENT)
    # (the shard queues `<name>.shard-<i>` are deleted with `name` after the test)
    stats, rows, _ = _read_all_shards(spark, amqp_url, rabbitmq, layout, tmp_path, 400)
    # One runner process per queue: the queues' I/O does not share one interpreter.
    assert len({st["pid"] for st in stats["per_queue"].values()}) == 2
    by_customer: dict[str, list[tuple[str, int, str]]] = {}
    for r in rows:
        assert r["queue"] == layout.queue_for(r["customer"])
        by_customer.setdefault(r["customer"], []).append((r["queue"], r["seq"], r["message_id"]))
    for customer, seen in by_customer.items():
        assert len({q for q, _, _ in seen}) == 1, customer  # one shard per key
        in_seq = [mid for _, _, mid in sorted(seen)]
        assert in_seq == sorted(in_seq), customer  # consumed in publish order


def test_consistent_hash_shards_are_read_each_message_once_and_left_empty(
    spark, amqp_url, rabbitmq, queue_factory, tmp_path
):
    # The x-consistent-hash exchange routes (its plugin runs on the test kit's own brokers,
    # 3.10 and 4.x); the query names the shards by exchange, as read_stream's users do.
    name = queue_factory("chash")
    try:
        layout = aks.declare_shards(amqp_url, name, 2, kind=aks.ShardKind.CONSISTENT)
    except ValueError:
        if rabbitmq.own:
            raise
        pytest.skip(
            "the broker of AMQP_URL has no x-consistent-hash exchange: enable its plugin "
            "(rabbitmq-plugins enable rabbitmq_consistent_hash_exchange) to run this test"
        )
    _, rows, _ = _read_all_shards(
        spark, amqp_url, rabbitmq, layout, tmp_path, 300, via_exchange=True
    )
    home: dict[str, str] = {}
    for r in rows:
        assert home.setdefault(r["customer"], r["queue"]) == r["queue"]  # one shard per key
    assert set(home.values()) == set(layout.queues)


def test_write_ahead_log_on_s3_replays_and_resumes_exactly(
    spark, amqp_url, rabbitmq, queue_factory, tmp_path, s3_base
):
    q = queue_factory("s3wal")
    wal = child_location(s3_base, q)
    good, _ = publish_orders(amqp_url, q, 300)

    def run() -> Any:
        query, _ = start_query(
            spark,
            url=amqp_url,
            queue=q,
            checkpoint=tmp_path / "ck",
            output=tmp_path / "out",
            max_batch=100,
            wal_location=wal,
        )
        return query

    query = run()
    try:
        wait_until_drained(query, url=amqp_url, queue=q, checkpoint=tmp_path / "ck", timeout=120)
    finally:
        query.stop()
    # The log is on the object store, not on the local disk.
    assert not (tmp_path / "ck" / "ackkit").exists()
    objects = _objects(wal)
    assert any(n.startswith("batch-") for n in objects), objects
    assert any(n.startswith("written-") for n in objects), objects
    # Resume on the same checkpoint: the rest, once.
    more, _ = publish_orders(amqp_url, q, 200, start=300)
    query = run()
    try:
        wait_until_drained(query, url=amqp_url, queue=q, checkpoint=tmp_path / "ck", timeout=120)
    finally:
        query.stop()
    ids = output_ids(spark, tmp_path / "out")
    assert sorted(ids) == sorted(good + more)
    c = rabbitmq.counts(q)
    assert (c.ready, c.unacked) == (0, 0)


def _objects(wal: str) -> list[str]:
    """Names of the objects in the queue's log directory under `wal`."""
    import pyarrow.fs as pafs

    store = Store(wal)
    fs, root = store._fs, store._root
    sel = pafs.FileSelector(root, recursive=True, allow_not_found=True)
    return [Path(i.path).name for i in fs.get_file_info(sel) if i.type == pafs.FileType.File]
