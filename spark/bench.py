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


def prefill_shards(url: str, name: str, shards: int, n: int) -> list[str]:
    """Client-routed shard queues of `name` with n messages spread by key; their names."""
    layout = aks.declare_shards(url, name, shards, kind=aks.ShardKind.CLIENT)
    conn = pika.BlockingConnection(pika.URLParameters(url))
    try:
        ch = conn.channel()
        for q in layout.queues:
            ch.queue_purge(q)
        pub = aks.ShardPublisher(ch, layout)
        for i in range(n):
            props = pika.BasicProperties(delivery_mode=2, message_id=f"b{i}")
            pub.publish(f"key-{i}", BODY, props)
        deadline = time.monotonic() + 120
        while (
            sum(ch.queue_declare(q, passive=True).method.message_count for q in layout.queues) < n
        ):
            if time.monotonic() > deadline:
                raise RuntimeError(f"pre-fill of {name} shards did not reach {n}")
            conn.sleep(0.2)
    finally:
        conn.close()
    return list(layout.queues)


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


def steady_batch(n: int) -> int:
    """The batch size of the steady-state case: the default, but at most n / 5, so that
    the steady window (after the first batch) holds several batches."""
    return max(min(DEFAULT_BATCH, n // 5), 100)


def run_steady(url: str, queue: str | list[str], n: int) -> dict[str, float]:
    """The harness's steady-state case: {"messages", "seconds"} after the first batch."""
    res = drain(url, queue, n, max_batch=steady_batch(n))
    return {"messages": res["steady_messages"], "seconds": res["steady_s"]}


def warm(url: str = DEFAULT_URL) -> None:
    """Start the SparkSession and warm the JVM with a 5,000-message query."""
    queue = f"ackkit.bench.warm.{os.getpid()}"
    prefill(url, queue, 5000)
    try:
        try:
            drain(url, queue, 5000, max_batch=2500)
        except RuntimeError:
            # On a loaded machine Spark's first Python worker can miss its fixed 10 s to
            # connect back ("Python worker failed to connect back"): warm once more.
            prefill(url, queue, 5000)
            drain(url, queue, 5000, max_batch=2500)
    finally:
        delete_queue(url, queue)


def drain(
    url: str,
    queue: str | list[str],
    n: int,
    *,
    max_batch: int = DEFAULT_BATCH,
    workdir: str | os.PathLike[str] | None = None,
    timeout: float = 600.0,
    profile: bool = False,
    **options: Any,
) -> dict[str, Any]:
    """Drain `n` pre-filled messages of `queue` (or of several queues, read in parallel)
    to Parquet with ack after commit.

    Returns once every message is written and acked (the broker has processed the
    acks), and the query is stopped: {"seconds" (start to end), "first_batch_s" (start
    to the first acked batch), "steady_s" and "steady_messages" (after it), "batches"}.
    The SparkSession is reused between calls.
    """
    spark = session()
    base = Path(workdir) if workdir is not None else Path(tempfile.mkdtemp(prefix="ackkit-bench-"))
    ckpt, out = base / "ck", base / "out"
    where: dict[str, Any] = {"queue": queue} if isinstance(queue, str) else {"queues": queue}
    df = aks.read_stream(spark, url=url, checkpoint=ckpt, max_batch=max_batch, **where, **options)
    writer = aks.ack_after_commit(aks.parquet_batches(out), checkpoint=ckpt)
    marks: list[tuple[float, int]] = []
    driver: list[dict[str, float]] = []
    plain = writer.writer

    def parquet(df: Any, batch_id: int) -> None:
        driver.append({"batch": batch_id, "write_called": time.monotonic()})
        plain(df, batch_id)
        driver[-1]["written"] = time.monotonic()

    writer.writer = parquet

    def timed(df: Any, batch_id: int) -> None:
        before = writer.acked
        writer(df, batch_id)
        if driver and driver[-1]["batch"] == batch_id:
            driver[-1]["acked"] = time.monotonic()
            driver[-1]["rows"] = writer.acked - before
        if writer.acked:
            marks.append((time.monotonic(), writer.acked))

    t0 = time.monotonic()
    query = (
        df.select("seq", "message_id", "body", "redelivered", "attempt")
        .writeStream.foreachBatch(timed)
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
        queues = [queue] if isinstance(queue, str) else list(queue)
        runner = {q: aks.source_stats(ckpt, q) for q in queues}
        timings = {q: _timings(ckpt, q) for q in queues} if profile else {}
        progress = [p["durationMs"] for p in query.recentProgress if p["numInputRows"]]
    finally:
        query.stop()
        if workdir is None:
            shutil.rmtree(base, ignore_errors=True)
    (t_first, first), (t_last, last) = marks[0], marks[-1]
    steady_s = t_last - t_first
    return {
        "messages": n,
        "seconds": seconds,
        "first_batch_s": t_first - t0,
        "steady_s": steady_s if last > first else seconds,
        "steady_messages": last - first if last > first else n,
        "batches": writer.batches,
        "max_batch": max_batch,
        "runner_cpu_s": {q: st.get("cpu_s") for q, st in runner.items()},
        "profile": breakdown(driver, timings) if profile else None,
        "spark_ms": _median_ms(progress[1:]) if profile else None,
    }


def _median_ms(durations: list[dict[str, int]]) -> dict[str, float]:
    """Spark's own per-batch durations (query progress `durationMs`), medians over the
    batches with rows after the first: latestOffset (the source's read), walCommit (the
    offset log), queryPlanning, addBatch (foreachBatch: write and ack), commitOffsets
    (the commit log), triggerExecution (the whole batch)."""
    keys = sorted({k for d in durations for k in d})
    return {k: statistics.median(d.get(k, 0) for d in durations) for k in keys}


def _timings(ckpt: Path, queue: str) -> list[dict[str, float]]:
    from ackkit.spark._ipc import request
    from ackkit.spark._options import ipc_address
    from ackkit.spark._store import normalize_location

    reply = request(ipc_address(normalize_location(ckpt), queue), {"op": "timings"}, 10.0)
    return list(reply.get("timings", []))


def breakdown(
    driver: list[dict[str, float]], timings: dict[str, list[dict[str, float]]]
) -> dict[str, Any]:
    """Median seconds per batch of each step, batches with rows after the first:

    runner_wait (read() waiting for the buffer to fill), arrow (rows to Arrow), wal (the
    write-ahead log), to_writer (runner returned -> foreachBatch called: Spark's offset
    log, planning, moving the rows to the JVM, the job's start), write (the Parquet
    job), ack (the runners' acks), to_next_read (acked -> the next read(): Spark's
    commit log, commit(), planning the next batch)."""
    runner = sorted((t for ts in timings.values() for t in ts), key=lambda t: t["called"])
    batches = [d for d in driver if d.get("rows") and "acked" in d]
    steps: dict[str, list[float]] = {
        k: [] for k in ("runner_wait", "arrow", "wal", "to_writer", "write", "ack", "to_next_read")
    }
    cycle: list[float] = []
    for i, d in enumerate(batches[1:], start=1):
        mine = [t for t in runner if t["returned"] <= d["write_called"]]
        later = [t for t in runner if t["called"] >= d["acked"]]
        if not mine or not later:
            continue
        prev = [t for t in mine if t["called"] >= batches[i - 1]["acked"]] or mine[-1:]
        t = prev[-1]
        steps["runner_wait"].append(max(p["wait_s"] for p in prev))
        steps["arrow"].append(sum(p["arrow_s"] for p in prev))
        steps["wal"].append(sum(p["wal_s"] for p in prev))
        steps["to_writer"].append(d["write_called"] - t["returned"])
        steps["write"].append(d["written"] - d["write_called"])
        steps["ack"].append(d["acked"] - d["written"])
        steps["to_next_read"].append(later[0]["called"] - d["acked"])
        cycle.append(later[0]["called"] - prev[0]["called"])
    med = {k: round(statistics.median(v), 4) if v else None for k, v in steps.items()}
    med["cycle"] = round(statistics.median(cycle), 4) if cycle else None
    med["batches"] = len(cycle)
    return med


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


def curve(
    url: str,
    n: int,
    batches: list[int],
    rounds: int = 1,
    *,
    shards: list[int] | None = None,
    shard_batch: int = DEFAULT_BATCH,
    profile: bool = False,
) -> dict[str, Any]:
    """Raw pika, then each batch size (one queue), then each shard count (at
    `shard_batch`), `rounds` times interleaved (the machine's noise hits every case
    alike); each case reports its median, whole run and steady state (after the first
    batch) apart."""
    queue = f"ackkit.bench.spark.{os.getpid()}"
    warm(url)  # JVM start-up, code generation, the Parquet writer: not measured
    raw: list[float] = []
    plan: list[tuple[str, int, int]] = [(f"max_batch={b}", b, 0) for b in batches]
    plan += [(f"shards={k} max_batch={shard_batch}", shard_batch, k) for k in shards or []]
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name, _, _ in plan}
    for r in range(rounds):
        prefill(url, queue, n)
        raw.append(n / raw_pika(url, queue, n))
        print(f"round {r + 1}: raw pika {raw[-1]:,.0f} msg/s", flush=True)
        for name, b, k in plan:
            if k:
                target: str | list[str] = prefill_shards(url, f"{queue}.s{k}", k, n)
            else:
                prefill(url, queue, n)
                target = queue
            res = drain(url, target, n, max_batch=b, profile=profile)
            runs[name].append(res)
            print(
                f"round {r + 1}: spark {name}: {n / res['seconds']:,.0f} msg/s, steady "
                f"{res['steady_messages'] / res['steady_s']:,.0f} msg/s"
                + (f", per batch {res['profile']}, spark ms {res['spark_ms']}" if profile else ""),
                flush=True,
            )
            if k:
                for q in target:
                    delete_queue(url, q)
    raw_rate = statistics.median(raw)
    results: dict[str, Any] = {
        "messages": n,
        "rounds": rounds,
        "raw_pika": {"msgs_per_s": round(raw_rate), "runs": [round(x) for x in raw]},
        "cases": [],
    }
    print(f"\n{'case':<30}{'msg/s':>9}{'vs raw':>8}{'steady':>9}{'vs raw':>8}{'batches':>9}")
    print(f"{'raw pika (ack every 100)':<30}{raw_rate:>9,.0f}{1:>8.2f}")
    for name, b, k in plan:
        rs = runs[name]
        rate = statistics.median(n / x["seconds"] for x in rs)
        steady = statistics.median(x["steady_messages"] / x["steady_s"] for x in rs)
        results["cases"].append(
            {
                "case": name,
                "max_batch": b,
                "shards": k,
                "msgs_per_s": round(rate),
                "vs_raw": round(rate / raw_rate, 2),
                "steady_msgs_per_s": round(steady),
                "steady_vs_raw": round(steady / raw_rate, 2),
                "first_batch_s": round(statistics.median(x["first_batch_s"] for x in rs), 2),
                "batches": rs[0]["batches"],
                "runner_cpu_s": rs[0]["runner_cpu_s"],
                "profile": rs[0]["profile"],
                "spark_ms": rs[0]["spark_ms"],
                "runs": [round(n / x["seconds"]) for x in rs],
            }
        )
        print(
            f"{name:<30}{rate:>9,.0f}{rate / raw_rate:>8.2f}{steady:>9,.0f}"
            f"{steady / raw_rate:>8.2f}{rs[0]['batches']:>9}"
        )
    delete_queue(url, queue)
    return results


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default=os.environ.get("AMQP_URL", DEFAULT_URL))
    p.add_argument("--messages", type=int, default=100_000)
    p.add_argument("--batches", default="1000,5000,20000")
    p.add_argument("--shards", default="", help="shard counts to run, e.g. 1,2,4")
    p.add_argument("--shard-batch", type=int, default=DEFAULT_BATCH)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--profile", action="store_true", help="per-batch time breakdown")
    p.add_argument("--json", default=None, help="write the results here")
    args = p.parse_args(argv)
    batches = [int(x) for x in args.batches.split(",") if x]
    shards = [int(x) for x in args.shards.split(",") if x]
    res = curve(
        args.url,
        args.messages,
        batches,
        args.rounds,
        shards=shards,
        shard_batch=args.shard_batch,
        profile=args.profile,
    )
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2))
    if _session is not None:
        _session.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
