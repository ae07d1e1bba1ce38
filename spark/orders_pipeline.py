"""The orders pipeline: RabbitMQ -> pydantic validation -> Parquet, acked after commit.

    python -m spark.orders_pipeline --url amqp://guest:guest@127.0.0.1:5672/%2f --messages 3000

publishes that many orders (one in a hundred malformed), streams them into
Parquet with Spark until the queue is drained, and prints what was written,
acked and dead-lettered, and the broker's queue table. Malformed orders go to
`<queue>.dlq` with an `ackkit-reason` header; every other order is in the
output exactly once, even when the driver is killed and restarted on the same
checkpoint (see `ackkit.spark` for the precise guarantee).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pika
from pydantic import BaseModel, Field

import ackkit.spark as aks

DEFAULT_URL = "amqp://guest:guest@127.0.0.1:5672/%2f"
REPO_ROOT = Path(__file__).resolve().parents[1]


class Order(BaseModel):
    """One order as the shop publishes it (JSON)."""

    order_id: str = Field(min_length=1)
    customer: str = Field(min_length=1)
    amount: float = Field(gt=0)
    currency: Literal["EUR", "USD", "GBP"]
    quantity: int = Field(ge=1)
    created_at: dt.datetime


# -- publishing ------------------------------------------------------------------------


def order_messages(
    n: int, *, poison_every: int = 0, start: int = 0
) -> Iterator[tuple[str, bytes, bool]]:
    """(message_id, body, valid) for orders start .. start+n-1; every poison_every-th is bad."""
    t0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    currencies = ("EUR", "USD", "GBP")
    for i in range(start, start + n):
        oid = f"order-{i:07d}"
        order: dict[str, Any] = {
            "order_id": oid,
            "customer": f"customer-{i % 97}",
            "amount": round(5 + (i * 7919 % 10_000) / 100, 2),
            "currency": currencies[i % 3],
            "quantity": 1 + i % 5,
            "created_at": (t0 + dt.timedelta(seconds=i)).isoformat(),
        }
        bad = poison_every > 0 and i % poison_every == poison_every - 1
        if bad:
            order["quantity"] = 0 if i % 2 else "several"
        yield oid, json.dumps(order).encode(), not bad


def customer_of(body: bytes) -> str:
    """The shard key of an order: its customer."""
    return str(json.loads(body)["customer"])


def publish_orders(
    url: str,
    queue: str,
    n: int,
    *,
    poison_every: int = 0,
    start: int = 0,
    layout: aks.ShardLayout | None = None,
) -> tuple[list[str], list[str]]:
    """Publish orders (persistent, with message_id, publisher confirms). Returns the ids of
    the valid and of the malformed ones. With a shard `layout` (then `queue` is unused),
    orders are routed by customer: one customer's orders go to one shard, in order."""
    good: list[str] = []
    bad: list[str] = []
    conn = pika.BlockingConnection(pika.URLParameters(url))
    try:
        ch = conn.channel()
        if layout is None:
            ch.queue_declare(queue, durable=True)
        ch.confirm_delivery()
        for oid, body, ok in order_messages(n, poison_every=poison_every, start=start):
            props = pika.BasicProperties(
                message_id=oid,
                content_type="application/json",
                delivery_mode=2,
                timestamp=int(time.time()),
            )
            if layout is None:
                ch.basic_publish("", queue, body, props)
            else:
                ch.basic_publish(*layout.route(customer_of(body)), body, props)
            (good if ok else bad).append(oid)
    finally:
        conn.close()
    return good, bad


# -- the broker's view -------------------------------------------------------------------


@dataclass(frozen=True)
class QueueRow:
    name: str
    ready: int
    unacked: int | None
    consumers: int


def queue_table(
    url: str, queues: list[str], counts: Callable[[str], Any] | None = None
) -> list[QueueRow]:
    """Ready / unacked counts as the broker reports them: `counts` (e.g. the test kit's
    BrokerHandle.counts, which knows which node serves `url`), else rabbitmqctl when it
    is on this machine and knows every queue, else a passive declare (no unacked)."""
    if counts is not None:
        rows_ = []
        for q in queues:
            try:
                c = counts(q)
            except Exception:  # e.g. the queue does not exist
                continue
            rows_.append(QueueRow(q, c.ready, c.unacked, c.consumers))
        return rows_
    vhost = pika.URLParameters(url).virtual_host
    ctl = shutil.which("rabbitmqctl") or shutil.which("/usr/sbin/rabbitmqctl")
    if ctl:
        try:
            out = subprocess.run(
                [
                    ctl,
                    "list_queues",
                    "-p",
                    vhost,
                    "--formatter",
                    "json",
                    "--quiet",
                    "name",
                    "messages_ready",
                    "messages_unacknowledged",
                    "consumers",
                ],
                capture_output=True,
                text=True,
                timeout=60,
                check=True,
            ).stdout
            rows = {r["name"]: r for r in json.loads(out[out.find("[") :])}
            return (
                [
                    QueueRow(
                        q,
                        int(rows[q]["messages_ready"]),
                        int(rows[q]["messages_unacknowledged"]),
                        int(rows[q]["consumers"]),
                    )
                    for q in queues
                    if q in rows
                ]
                if all(q in rows for q in queues)
                else _amqp_rows(url, queues)
            )
        except (subprocess.SubprocessError, ValueError, KeyError, OSError):
            pass
    return _amqp_rows(url, queues)


def _amqp_rows(url: str, queues: list[str]) -> list[QueueRow]:
    out_rows = []
    conn = pika.BlockingConnection(pika.URLParameters(url))
    try:
        for q in queues:
            ch = conn.channel()
            try:
                ok = ch.queue_declare(q, passive=True).method
                out_rows.append(QueueRow(q, ok.message_count, None, ok.consumer_count))
                ch.close()
            except pika.exceptions.ChannelClosedByBroker:
                continue
    finally:
        conn.close()
    return out_rows


def print_queue_table(rows: list[QueueRow]) -> None:
    width = max([len(r.name) for r in rows] + [5])
    print(f"{'queue':<{width}}  {'ready':>7}  {'unacked':>7}  {'consumers':>9}")
    for r in rows:
        un = "?" if r.unacked is None else str(r.unacked)
        print(f"{r.name:<{width}}  {r.ready:>7}  {un:>7}  {r.consumers:>9}")


# -- Spark ---------------------------------------------------------------------------------


def spark_session(
    app: str = "ackkit-orders", *, cores: int = 2, conf: Mapping[str, str] | None = None
) -> Any:
    """A local SparkSession whose Python workers use this interpreter and see this repo.

    `conf` is set last, over these defaults: e.g. `spark.master` of a standalone cluster
    (see tests/spark/_spark_cluster.py) instead of `local[cores]`."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    path = os.environ.get("PYTHONPATH", "")
    if str(REPO_ROOT) not in path.split(os.pathsep):
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), path) if p)
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master(f"local[{cores}]")
        .appName(app)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(cores))
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.memory", "2g")
        # The source runner and Python workers must connect back to the JVM within this;
        # the default 15 s is missed on a machine busy with several JVMs.
        .config("spark.python.authenticate.socketTimeout", "120s")
    )
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def start_query(
    spark: Any,
    *,
    url: str,
    queue: str,
    checkpoint: str | os.PathLike[str],
    output: str | os.PathLike[str],
    max_batch: int = 5000,
    dead_letter: bool = True,
    writer: Callable[[Any, int], None] | None = None,
    layout: aks.ShardLayout | None = None,
    via_exchange: bool = False,
    **options: Any,
) -> tuple[Any, aks.AckAfterCommit]:
    """Start the streaming query; returns it and its ack_after_commit wrapper (counters).

    `writer(df, batch_id)` defaults to idempotent Parquet batches under `output`. With a
    shard `layout`, its queues are read in parallel (`queue` only names the query) and
    the output has a `queue` column; `via_exchange` names them as a user would, by the
    layout's exchange, number of shards and kind (`read_stream` declares it, idempotently).
    """
    where: dict[str, Any] = {"queue": queue} if layout is None else {"queues": layout.queues}
    if layout is not None and via_exchange:
        where = {"exchange": layout.name, "shards": layout.shards, "shard_kind": layout.kind}
    df = aks.read_stream(
        spark,
        url=url,
        **where,
        checkpoint=checkpoint,
        model=Order,
        max_batch=max_batch,
        on_invalid="dead_letter" if dead_letter else "fail",
        **options,
    )
    extra = ["queue"] if layout is not None else []
    orders = df.select("seq", "message_id", "attempt", "redelivered", *extra, *Order.model_fields)
    acking = aks.ack_after_commit(writer or aks.parquet_batches(output), checkpoint=checkpoint)
    query = aks.start(  # again if Spark's source runner misses its fixed 10 s start-up
        orders.writeStream.queryName(f"orders-{queue}")
        .foreachBatch(acking)
        .option("checkpointLocation", os.fspath(checkpoint))
    )
    return query, acking


def wait_until_drained(
    query: Any,
    *,
    url: str,
    queue: str | list[str] | tuple[str, ...],
    checkpoint: str | os.PathLike[str],
    timeout: float = 600.0,
    settle: float = 1.0,
) -> dict[str, Any]:
    """Block until the queue(s) are empty and every delivery the source(s) got is written
    and acked or dead-lettered (stable for `settle` seconds). Returns the source's
    counters (summed over the queues, with `per_queue` when there are several)."""
    queues = [queue] if isinstance(queue, str) else list(queue)
    deadline = time.monotonic() + timeout
    conn = pika.BlockingConnection(pika.URLParameters(url))
    calm_since: float | None = None
    stats: dict[str, Any] = {}
    try:
        ch = conn.channel()
        while True:
            exc = query.exception() if not query.isActive else None
            if exc is not None:
                raise RuntimeError(f"the streaming query failed: {exc}")
            try:
                ready = sum(ch.queue_declare(q, passive=True).method.message_count for q in queues)
            except pika.exceptions.AMQPConnectionError:
                # Our own watching connection was cut (a shared broker): watch on a new one.
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
                conn = pika.BlockingConnection(pika.URLParameters(url))
                ch = conn.channel()
                continue
            per: dict[str, dict[str, Any]] = {}
            for q in queues:
                try:
                    per[q] = aks.source_stats(checkpoint, q, timeout=5.0)
                except Exception:
                    per = {}
                    break
            stats = _summed(per) if len(queues) > 1 else per.get(queues[0], {})
            busy = (
                ready
                or not per
                or any(
                    st.get(k, 1)
                    for st in per.values()
                    for k in ("buffered", "unwritten", "holding", "republishing", "pending_acks")
                )
            )
            now = time.monotonic()
            if busy:
                calm_since = None
            elif calm_since is None:
                calm_since = now
            elif now - calm_since >= settle:
                return stats
            if now > deadline:
                raise TimeoutError(f"{queues!r} not drained within {timeout:.0f} s: {stats}")
            time.sleep(0.25)
    finally:
        if conn.is_open:
            conn.close()


def _summed(per: dict[str, dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for st in per.values():
        for k, v in st.items():
            if isinstance(v, int) and not isinstance(v, bool) and k != "pid":
                out[k] = out.get(k, 0) + v
    if per:
        out["per_queue"] = per
    return out


def count_output(spark: Any, output: str | os.PathLike[str]) -> tuple[int, int]:
    """(rows, distinct message ids) in the Parquet output."""
    if not Path(output).exists():
        return 0, 0
    df = spark.read.parquet(os.fspath(output))
    row = df.selectExpr("count(*) AS n", "count(DISTINCT message_id) AS d").collect()[0]
    return int(row["n"]), int(row["d"])


# -- the demo ---------------------------------------------------------------------------------


def run_demo(
    url: str = DEFAULT_URL,
    n_messages: int = 3000,
    *,
    poison_every: int = 100,
    max_batch: int = 1000,
    queue: str | None = None,
    workdir: str | os.PathLike[str] | None = None,
    spark: Any = None,
    counts: Callable[[str], Any] | None = None,
) -> dict[str, Any]:
    """Publish orders, stream them to Parquet until the queue is drained, print a summary.

    Returns {"published", "valid", "malformed", "rows_written", "distinct_ids", "acked",
    "dead_lettered", "batches", "seconds", "queues": {name: {"ready", "unacked"}}}.
    """
    queue = queue or "ackkit.demo.orders"  # emptied first: a rerun starts afresh
    dlq = f"{queue}.dlq"
    own_dir = workdir is None
    base = Path(workdir) if workdir is not None else Path(tempfile.mkdtemp(prefix="ackkit-demo-"))
    checkpoint, output = base / "checkpoint", base / "orders.parquet"
    conn = pika.BlockingConnection(pika.URLParameters(url))
    try:
        ch = conn.channel()
        ch.queue_delete(queue)
        ch.queue_delete(dlq)
    finally:
        conn.close()
    good, bad = publish_orders(url, queue, n_messages, poison_every=poison_every)
    print(f"published {n_messages} orders to {queue!r} ({len(bad)} malformed)")
    session = spark if spark is not None else spark_session()
    t0 = time.monotonic()
    query, writer = start_query(
        session, url=url, queue=queue, checkpoint=checkpoint, output=output, max_batch=max_batch
    )
    try:
        stats = wait_until_drained(query, url=url, queue=queue, checkpoint=checkpoint)
    finally:
        query.stop()
    seconds = time.monotonic() - t0
    rows, distinct = count_output(session, output)
    table = queue_table(url, [queue, dlq], counts)
    print(
        f"rows written: {rows} ({distinct} distinct orders) | acked after commit: "
        f"{writer.acked} in {writer.batches} batches | dead-lettered: "
        f"{stats.get('dead_lettered', 0)} | {seconds:.1f} s"
    )
    print_queue_table(table)
    result = {
        "published": n_messages,
        "valid": len(good),
        "malformed": len(bad),
        "rows_written": rows,
        "distinct_ids": distinct,
        "acked": writer.acked,
        "dead_lettered": int(stats.get("dead_lettered", 0)),
        "batches": writer.batches,
        "seconds": round(seconds, 2),
        "queues": {r.name: {"ready": r.ready, "unacked": r.unacked} for r in table},
        "output": str(output),
    }
    if spark is None:
        session.stop()
    if own_dir:
        shutil.rmtree(base, ignore_errors=True)
        result["output"] = None
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default=os.environ.get("AMQP_URL", DEFAULT_URL))
    p.add_argument("--messages", type=int, default=3000)
    p.add_argument("--poison-every", type=int, default=100)
    p.add_argument("--max-batch", type=int, default=1000)
    p.add_argument("--workdir", default=None, help="keep checkpoint and output here")
    args = p.parse_args(argv)
    result = run_demo(
        args.url,
        args.messages,
        poison_every=args.poison_every,
        max_batch=args.max_batch,
        workdir=args.workdir,
    )
    ok = result["rows_written"] == result["valid"] == result["distinct_ids"]
    ok = ok and all(
        q["ready"] == 0 and q["unacked"] in (0, None)
        for name, q in result["queues"].items()
        if not name.endswith(".dlq")
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
