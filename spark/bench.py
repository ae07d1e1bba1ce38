"""Throughput of the Spark source: drain a pre-filled queue to Parquet, acked after commit.

    python -m spark.bench --messages 100000 --batches 1000,5000,20000

prints messages/s per max batch size next to a raw pika consumer (multiple-ack every
100, prefetch 1000) draining the same kind of queue in the same run. The benchmark
harness calls `run_case(url, queue, n)` (one case, default batch size).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pika

import ackkit.spark as aks

DEFAULT_URL = "amqp://guest:guest@127.0.0.1:5672/%2f"
DEFAULT_BATCH = 20_000
BODY = (b"ackkit benchmark payload 0123456789 abcdefghijklmnopqrstuvwxyz. " * 4)[:200]

_session: Any = None


def session() -> Any:
    """One SparkSession per process (started on first use, outside the timed part)."""
    global _session
    if _session is None:
        from spark.orders_pipeline import spark_session

        _session = spark_session("ackkit-bench")
    return _session


def prefill(url: str, queue: str, n: int, *, with_ids: bool = True) -> None:
    """A fresh durable queue with n persistent 200-byte messages."""
    conn = pika.BlockingConnection(pika.URLParameters(url))
    try:
        ch = conn.channel()
        ch.queue_delete(queue)
        ch.queue_declare(queue, durable=True)
        for i in range(n):
            props = pika.BasicProperties(delivery_mode=2, message_id=f"b{i}" if with_ids else None)
            ch.basic_publish("", queue, BODY, props)
        # a confirm-mode round trip would slow the fill; wait until the broker has them
        deadline = time.monotonic() + 120
        while ch.queue_declare(queue, passive=True).method.message_count < n:
            if time.monotonic() > deadline:
                raise RuntimeError(f"pre-fill of {queue} did not reach {n}")
            conn.sleep(0.2)
    finally:
        conn.close()


def delete_queue(url: str, queue: str) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(url))
    try:
        ch = conn.channel()
        ch.queue_delete(queue)
        ch.queue_delete(f"{queue}.dlq")
    finally:
        conn.close()


def run_case(url: str, queue: str, n: int) -> None:
    """The benchmark harness's case: drain n pre-filled messages (default batch size).

    Call `warm()` before timing (e.g. when the case module is imported): it starts the
    SparkSession and runs a small query, which takes longer than draining 100,000
    messages.
    """
    drain(url, queue, n)


def warm(url: str = DEFAULT_URL) -> None:
    """Start the SparkSession and warm the JVM with a 5,000-message query."""
    queue = f"ackkit.bench.warm.{os.getpid()}"
    prefill(url, queue, 5000)
    try:
        drain(url, queue, 5000, max_batch=5000)
    finally:
        delete_queue(url, queue)


def drain(
    url: str,
    queue: str,
    n: int,
    *,
    max_batch: int = DEFAULT_BATCH,
    workdir: str | os.PathLike[str] | None = None,
    timeout: float = 600.0,
    **options: Any,
) -> dict[str, Any]:
    """Drain `n` pre-filled messages of `queue` to Parquet with ack after commit.

    Returns once every message is written and acked (the broker has processed the
    acks), and the query is stopped. The SparkSession is reused between calls.
    """
    spark = session()
    base = Path(workdir) if workdir is not None else Path(tempfile.mkdtemp(prefix="ackkit-bench-"))
    ckpt, out = base / "ck", base / "out"
    df = aks.read_stream(
        spark, url=url, queue=queue, checkpoint=ckpt, max_batch=max_batch, **options
    )
    writer = aks.ack_after_commit(aks.parquet_batches(out), checkpoint=ckpt)
    t0 = time.monotonic()
    query = (
        df.select("seq", "message_id", "body", "redelivered", "attempt")
        .writeStream.foreachBatch(writer)
        .option("checkpointLocation", str(ckpt))
        .start()
    )
    try:
        while writer.acked < n:
            if not query.isActive:
                raise RuntimeError(f"query failed: {query.exception()}")
            if time.monotonic() - t0 > timeout:
                raise TimeoutError(f"{writer.acked} of {n} acked after {timeout:.0f} s")
            time.sleep(0.02)
        seconds = time.monotonic() - t0
    finally:
        query.stop()
        if workdir is None:
            shutil.rmtree(base, ignore_errors=True)
    return {"messages": n, "seconds": seconds, "batches": writer.batches, "max_batch": max_batch}


def raw_pika(url: str, queue: str, n: int, *, prefetch: int = 1000, ack_every: int = 100) -> float:
    """Seconds a plain pika consumer takes to drain n messages (multiple-ack every k)."""
    conn = pika.BlockingConnection(pika.URLParameters(url))
    try:
        ch = conn.channel()
        ch.basic_qos(prefetch_count=prefetch)
        count = 0
        t0 = time.monotonic()

        def on_message(c: Any, method: Any, _props: Any, _body: bytes) -> None:
            nonlocal count
            count += 1
            if count % ack_every == 0 or count == n:
                c.basic_ack(method.delivery_tag, multiple=True)
            if count >= n:
                c.stop_consuming()

        ch.basic_consume(queue, on_message)
        ch.start_consuming()
        return time.monotonic() - t0
    finally:
        conn.close()


def curve(url: str, n: int, batches: list[int], rounds: int = 1) -> dict[str, Any]:
    """Raw pika, then each batch size, `rounds` times interleaved (the machine's noise
    hits every case alike); each case reports its median."""
    queue = f"ackkit.bench.spark.{os.getpid()}"
    warm(url)  # JVM start-up, code generation, the Parquet writer: not measured
    raw: list[float] = []
    spark_runs: dict[int, list[dict[str, Any]]] = {b: [] for b in batches}
    for r in range(rounds):
        prefill(url, queue, n)
        raw.append(n / raw_pika(url, queue, n))
        print(f"round {r + 1}: raw pika {raw[-1]:,.0f} msg/s", flush=True)
        for b in batches:
            prefill(url, queue, n)
            res = drain(url, queue, n, max_batch=b)
            spark_runs[b].append(res)
            print(
                f"round {r + 1}: spark max_batch={b}: {n / res['seconds']:,.0f} msg/s", flush=True
            )
    raw_rate = statistics.median(raw)
    results: dict[str, Any] = {
        "messages": n,
        "rounds": rounds,
        "raw_pika": {"msgs_per_s": round(raw_rate), "runs": [round(x) for x in raw]},
        "cases": [],
    }
    print(f"\n{'case':<24}{'msg/s':>10}{'vs raw':>8}{'batches':>9}")
    print(f"{'raw pika (ack every 100)':<24}{raw_rate:>10,.0f}{1:>8.2f}{'-':>9}")
    for b, runs in spark_runs.items():
        rate = statistics.median(n / x["seconds"] for x in runs)
        results["cases"].append(
            {
                "max_batch": b,
                "msgs_per_s": round(rate),
                "vs_raw": round(rate / raw_rate, 2),
                "batches": runs[0]["batches"],
                "runs": [round(n / x["seconds"]) for x in runs],
            }
        )
        print(
            f"{f'spark max_batch={b}':<24}{rate:>10,.0f}{rate / raw_rate:>8.2f}"
            f"{runs[0]['batches']:>9}"
        )
    delete_queue(url, queue)
    return results


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default=os.environ.get("AMQP_URL", DEFAULT_URL))
    p.add_argument("--messages", type=int, default=100_000)
    p.add_argument("--batches", default="1000,5000,20000")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--json", default=None, help="write the results here")
    args = p.parse_args(argv)
    batches = [int(x) for x in args.batches.split(",")]
    res = curve(args.url, args.messages, batches, args.rounds)
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2))
    if _session is not None:
        _session.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
