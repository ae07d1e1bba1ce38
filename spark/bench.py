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


def warm(url: str = DEFAULT_URL, n: int = 40_000) -> None:
    """Start the SparkSession and warm the JVM with an n-message query in batches of up
    to 20,000: the JIT compiles the per-row paths only after enough rows (with a 5,000-row
    warm-up, the first measured run used twice the JVM CPU per message of later ones)."""
    queue = f"ackkit.bench.warm.{os.getpid()}"
    batch = min(DEFAULT_BATCH, max(n // 2, 100))
    prefill(url, queue, n)
    try:
        try:
            drain(url, queue, n, max_batch=batch)
        except RuntimeError:
            # On a loaded machine Spark's first Python worker can miss its fixed 10 s to
            # connect back ("Python worker failed to connect back"): warm once more.
            prefill(url, queue, n)
            drain(url, queue, n, max_batch=batch)
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
    cpu0: dict[str, float] | None = None
    try:
        while writer.acked < n:
            if profile and cpu0 is None and marks:
                cpu0 = process_cpu()  # the steady window starts at the first ack
            if not query.isActive:
                raise RuntimeError(f"query failed: {query.exception()}")
            if time.monotonic() - t0 > timeout:
                raise TimeoutError(f"{writer.acked} of {n} acked after {timeout:.0f} s")
            time.sleep(0.02)
        seconds = time.monotonic() - t0
        cpu1 = process_cpu() if profile else None
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
        "runner_gc_s": {q: st.get("gc_s") for q, st in runner.items()},
        "profile": breakdown(driver, timings) if profile else None,
        "spark_ms": _median_ms(progress[1:]) if profile else None,
        "cpu_ms_per_1k": _cpu_per_1k(cpu0, cpu1, marks),
    }


BROKER_PID: int | None = None
"""The broker's process (e.g. RabbitMQ's beam.smp), if known: its CPU is counted too
(all of it: on a shared broker, other clients' work as well)."""


def _proc_cpu(pid: int) -> float:
    stat = Path(f"/proc/{pid}/stat").read_text()
    f = stat[stat.rindex(")") + 2 :].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def process_cpu() -> dict[str, float]:
    """CPU seconds so far of this process and its descendants (Linux /proc), by role:
    driver (this Python), jvm, runner (the source runners), workers (Spark's other Python
    processes: executors' workers, their daemon); and the broker's (`BROKER_PID`)."""
    tick = os.sysconf("SC_CLK_TCK")
    procs: dict[int, tuple[int, float, str]] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        f = stat[stat.rindex(")") + 2 :].split()
        procs[int(d.name)] = (int(f[1]), (int(f[11]) + int(f[12])) / tick, cmd)
    me = os.getpid()
    out = {"driver": 0.0, "jvm": 0.0, "runner": 0.0, "workers": 0.0}
    for pid, (_ppid, cpu, cmd) in procs.items():
        p, up = pid, set()
        while p in procs and p != me and p not in up:
            up.add(p)
            p = procs[p][0]
        if p != me:
            continue
        if pid == me:
            role = "driver"
        elif "java" in cmd.split(" ")[0]:
            role = "jvm"
        elif "python_streaming_source_runner" in cmd:
            role = "runner"
        else:
            role = "workers"
        out[role] += cpu
    if BROKER_PID is not None:
        out["broker"] = _proc_cpu(BROKER_PID)
    return out


def _cpu_per_1k(
    before: dict[str, float] | None, after: dict[str, float] | None, marks: list[tuple[float, int]]
) -> dict[str, float] | None:
    """CPU milliseconds per 1,000 messages in the steady window, by role."""
    if before is None or after is None or marks[-1][1] <= marks[0][1]:
        return None
    k = (marks[-1][1] - marks[0][1]) / 1000
    return {r: round((after[r] - before[r]) * 1000 / k, 1) for r in after}


def _median_ms(durations: list[dict[str, int]]) -> dict[str, float]:
    """Spark's own per-batch durations (query progress `durationMs`), medians over the
    batches with rows after the first: latestOffset (the source's read), walCommit (the
    offset log), queryPlanning, addBatch (foreachBatch: write and ack), commitOffsets
    (the commit log), triggerExecution (the whole batch)."""
    keys = sorted({k for d in durations for k in d})
    return {k: statistics.median(d.get(k, 0) for d in durations) for k in keys}


def _timings(ckpt: Path, queue: str) -> list[dict[str, float]]:
    """The runner's timings of its batches, and of its acks (entries with "mark_s")."""
    from ackkit.spark._ipc import request
    from ackkit.spark._options import ipc_address
    from ackkit.spark._store import normalize_location

    reply = request(ipc_address(normalize_location(ckpt), queue), {"op": "timings"}, 10.0)
    return list(reply.get("timings", [])) + list(reply.get("acks", []))


def breakdown(
    driver: list[dict[str, float]], timings: dict[str, list[dict[str, float]]]
) -> dict[str, Any]:
    """Median seconds per batch of each step, batches with rows after the first:

    runner_wait (read() waiting for the buffer to fill), arrow (rows to Arrow), wal (the
    write-ahead log), to_writer (runner returned -> foreachBatch called: Spark's offset
    log, planning, moving the rows to the JVM, the job's start), write (the Parquet
    job), ack (the runners' acks; of it, in the runner: ack_mark, the durable "written up
    to" marker, and ack_send, the ledger's acks sent), to_next_read (acked -> the next
    read(): Spark's commit log, commit(), planning the next batch)."""
    acks = [t for ts in timings.values() for t in ts if "mark_s" in t][1:]
    runner = sorted(
        (t for ts in timings.values() for t in ts if "called" in t), key=lambda t: t["called"]
    )
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
    for k in ("mark", "send"):
        v = [a["mark_s" if k == "mark" else "ack_s"] for a in acks]
        med[f"ack_{k}"] = round(statistics.median(v), 4) if v else None
    med["cycle"] = round(statistics.median(cycle), 4) if cycle else None
    med["batches"] = len(cycle)
    return med


RAW_CPU: list[float] = []
"""CPU seconds of each raw_pika() drain (this process: the consumer's side)."""
RAW_BROKER_CPU: list[float] = []
"""The broker's CPU seconds during each raw_pika() drain (with BROKER_PID)."""


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
        c0 = time.process_time()
        b0 = _proc_cpu(BROKER_PID) if BROKER_PID is not None else 0.0
        ch.start_consuming()
        RAW_CPU.append(time.process_time() - c0)
        if BROKER_PID is not None:
            RAW_BROKER_CPU.append(_proc_cpu(BROKER_PID) - b0)
        return time.monotonic() - t0
    finally:
        conn.close()


Case = tuple[str, int, int, dict[str, Any]]
"""(name, max_batch, shard count (0: one plain queue), extra source options for `drain`)."""


def queue_cases(batches: list[int], shards: list[int], shard_batch: int) -> list[Case]:
    """The queue source's cases of a run: one queue per batch size, then each shard count
    (client-routed shard queues read in parallel, `shard_batch` each). Another source's
    cases (e.g. a streams source) go next to these in `curve`'s plan, as cases of their
    own kind, rather than into this list."""
    plan: list[Case] = [(f"max_batch={b}", b, 0, {}) for b in batches]
    plan += [(f"shards={k} max_batch={shard_batch}", shard_batch, k, {}) for k in shards]
    return plan


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
    plan = queue_cases(batches, shards or [], shard_batch)
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name, _, _, _ in plan}
    for r in range(rounds):
        prefill(url, queue, n)
        raw.append(n / raw_pika(url, queue, n))
        print(
            f"round {r + 1}: raw pika {raw[-1]:,.0f} msg/s, "
            f"cpu {RAW_CPU[-1] * 1e6 / n:.1f} ms per 1k"
            + (f", broker {RAW_BROKER_CPU[-1] * 1e6 / n:.1f}" if RAW_BROKER_CPU else ""),
            flush=True,
        )
        for name, b, k, extra in plan:
            if k:
                target: str | list[str] = prefill_shards(url, f"{queue}.s{k}", k, n)
            else:
                prefill(url, queue, n)
                target = queue
            res = drain(url, target, n, max_batch=b, profile=profile, **extra)
            runs[name].append(res)
            print(
                f"round {r + 1}: spark {name}: {n / res['seconds']:,.0f} msg/s, steady "
                f"{res['steady_messages'] / res['steady_s']:,.0f} msg/s"
                + (
                    f", per batch {res['profile']}, spark ms {res['spark_ms']}, "
                    f"cpu ms per 1k {res['cpu_ms_per_1k']}"
                    if profile
                    else ""
                ),
                flush=True,
            )
            if k:
                for q in target:
                    delete_queue(url, q)
    raw_rate = statistics.median(raw)
    results: dict[str, Any] = {
        "messages": n,
        "rounds": rounds,
        "raw_pika": {
            "msgs_per_s": round(raw_rate),
            "runs": [round(x) for x in raw],
            "cpu_ms_per_1k": [round(c * 1e6 / n, 1) for c in RAW_CPU[-rounds:]],
            "broker_cpu_ms_per_1k": [round(c * 1e6 / n, 1) for c in RAW_BROKER_CPU[-rounds:]],
        },
        "cases": [],
    }
    print(f"\n{'case':<38}{'msg/s':>9}{'vs raw':>8}{'steady':>9}{'vs raw':>8}{'batches':>9}")
    print(f"{'raw pika (ack every 100)':<38}{raw_rate:>9,.0f}{1:>8.2f}")
    for name, b, k, _ in plan:
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
                "runner_gc_s": rs[0]["runner_gc_s"],
                "profile": rs[0]["profile"],
                "spark_ms": rs[0]["spark_ms"],
                "cpu_ms_per_1k": [x["cpu_ms_per_1k"] for x in rs],
                "runs": [round(n / x["seconds"]) for x in rs],
            }
        )
        print(
            f"{name:<38}{rate:>9,.0f}{rate / raw_rate:>8.2f}{steady:>9,.0f}"
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
    p.add_argument("--broker-pid", type=int, default=None, help="count this process's CPU too")
    args = p.parse_args(argv)
    global BROKER_PID
    BROKER_PID = args.broker_pid
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
