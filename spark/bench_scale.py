"""Scale figures in one run: the stream source over 1, 2 and 4 partitions next to the
queue source over 1, 2 and 4 shard queues, and raw rstream / raw pika consumers reading
the same records.

    python -m spark.bench_scale [--messages 40000] [--version 4.3] [--only streams|queues]
                                [--json PATH]

One throwaway node of the test kit's own with the stream plugin (super streams: 3.11+),
one SparkSession (local[2], warmed first). Each Spark case reads N records of 200 bytes
into Parquet with the source's own sink (`parquet_batches`; the queue source acks after
each commit) and is timed from the query's start until the last record is written (the
queue source: acked; the stream source: an AvailableNow run's end); Spark's start-up is
outside. Each raw case reads the same records with the plain client: pika, one consumer
per queue in threads, prefetch 1000, a multiple-ack every 100; rstream, one subscription
per partition, once taking the bytes and once decoding each AMQP 1.0 message as the
source must (for its message id: the stream source's ratio is to this one). CPU per
message is this process and its descendants: driver, Spark's JVM, the source runners,
the Python workers, and the broker node (the test kit starts it as a child of this
process), so each row carries the broker's work for it too. On a shared 2-core machine
the shape is the point (per-partition rate, CPU per message as partitions grow), not
the absolute numbers. Prints a table, and writes JSON with `--json`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, ClassVar

import ackkit.spark as aks
from spark.bench import BODY, drain, prefill_shards, process_cpu, raw_pika, session, warm
from spark.bench_streams import raw_read

SIZES = (1, 2, 4)
CEILING = "Spark alone (rows from memory)"
BASE = {
    "stream source": "raw rstream, decoded",
    CEILING: "raw rstream, decoded",
    "queue source": "raw pika",
}
"""Each Spark case's raw client (its ratio's denominator)."""


def _cpu() -> float:
    return sum(process_cpu().values())


def _row(source: str, k: int, n: int, seconds: float, cpu_s: float) -> dict[str, Any]:
    rate = n / seconds
    return {
        "source": source,
        "parallel": k,
        "msgs_per_s": round(rate),
        "per_partition": round(rate / k),
        "cpu_us_per_msg": round(cpu_s * 1e6 / n, 1),
    }


def raw_pika_all(url: str, queues: list[str], per_queue: list[int]) -> float:
    """Seconds for one plain pika consumer per queue (threads) to drain them."""
    errors: list[BaseException] = []

    def one(q: str, n: int) -> None:
        try:
            raw_pika(url, q, n)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [
        threading.Thread(target=one, args=(q, n)) for q, n in zip(queues, per_queue, strict=True)
    ]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return time.monotonic() - t0


def queue_counts(url: str, queues: list[str]) -> list[int]:
    import pika

    conn = pika.BlockingConnection(pika.URLParameters(url))
    try:
        ch = conn.channel()
        return [ch.queue_declare(q, passive=True).method.message_count for q in queues]
    finally:
        conn.close()


def stream_source(
    spark: Any, url: str, port: int, name: str, cap: int
) -> tuple[float, dict[str, float]]:
    """Seconds for an AvailableNow run of the stream source to write everything, and the
    median of each of Spark's `durationMs` parts over the run's batches."""
    with tempfile.TemporaryDirectory(prefix="ackkit-bench-scale-") as d:
        ck = Path(d) / "ck"
        df = aks.read_stream_source(
            spark, url=url, checkpoint=ck, stream_port=port, super_stream=name,
            max_messages_per_trigger=cap,
        )  # fmt: skip
        return _timed(df, d, ck)


class MemoryRows:
    """The ceiling case: a streaming Python data source (`ackkit-bench-memory`) that hands
    Spark the stream source's rows (stream, offset, message_id, body) from memory, built
    once per process, in the same partitions and triggers: what Spark itself costs per
    row and per batch, with no broker and no decoding. No source over Spark's Python
    data source API can be faster than this case on the same machine."""

    _cache: ClassVar[dict[tuple[str, int], Any]] = {}

    @classmethod
    def rows(cls, stream: str, first: int, until: int) -> Any:
        import pyarrow as pa

        key = (stream, until - first)
        if key not in cls._cache:
            n = until - first
            cls._cache[key] = pa.RecordBatch.from_arrays(
                [
                    pa.array([stream] * n, pa.string()),
                    pa.array(range(n), pa.int64()),
                    pa.array([f"m-{i}" for i in range(n)], pa.string()),
                    pa.array([BODY] * n, pa.binary()),
                ],
                names=["stream", "offset", "message_id", "body"],
            )
        return cls._cache[key]


def memory_source(spark: Any, k: int, n: int, cap: int) -> tuple[float, dict[str, float]]:
    """`stream_source`'s run with `MemoryRows` in place of the broker."""
    from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
    from pyspark.sql.streaming.datasource import ReadMaxRows, SupportsTriggerAvailableNow

    class Part(InputPartition):
        def __init__(self, stream: str, first: int, until: int) -> None:
            self.stream, self.first, self.until = stream, first, until

    class Reader(DataSourceStreamReader, SupportsTriggerAvailableNow):
        def __init__(self, k: int, n: int) -> None:
            self.k, self.n = k, n

        def initialOffset(self) -> dict[str, int]:
            return {"at": 0}

        def prepareForTriggerAvailableNow(self) -> None:
            pass

        def getDefaultReadLimit(self) -> Any:
            return ReadMaxRows(cap)

        def latestOffset(self, start: dict[str, int], limit: Any) -> dict[str, int]:
            return {"at": min(self.n, start["at"] + limit.max_rows)}

        def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[Part]:
            per = (end["at"] - start["at"]) // self.k
            return [Part(f"p-{i}", start["at"] + i * per, start["at"] + (i + 1) * per)
                    for i in range(self.k) if per]  # fmt: skip

        def read(self, partition: Any) -> Any:
            yield MemoryRows.rows(partition.stream, partition.first, partition.until)

    class Source(DataSource):
        @classmethod
        def name(cls) -> str:
            return "ackkit-bench-memory"

        def schema(self) -> str:
            return "stream string, offset bigint, message_id string, body binary"

        def streamReader(self, schema: Any) -> Reader:
            return Reader(k, n)

    spark.dataSource.register(Source)
    with tempfile.TemporaryDirectory(prefix="ackkit-bench-scale-") as d:
        ck = Path(d) / "ck"
        df = spark.readStream.format("ackkit-bench-memory").load()
        return _timed(df, d, ck)


def _timed(df: Any, d: str, ck: Path) -> tuple[float, dict[str, float]]:
    """Run `df` into parquet_batches with AvailableNow: (seconds, median durationMs parts,
    steady msg/s: the rows after the first batch over the time from its end to the last
    batch's end)."""
    t0 = time.monotonic()
    q = (
        df.select("stream", "offset", "message_id", "body")
        .writeStream.foreachBatch(aks.parquet_batches(Path(d) / "out"))
        .option("checkpointLocation", str(ck))
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination()
    seconds = time.monotonic() - t0
    if q.exception() is not None:
        raise RuntimeError(str(q.exception()))
    parts: dict[str, list[float]] = {}
    batches = [p for p in q.recentProgress if p.numInputRows]
    for p in batches:
        for key, ms in (p.durationMs or {}).items():
            parts.setdefault(key, []).append(float(ms))
    medians = {k: statistics.median(v) for k, v in parts.items()}
    if len(batches) > 1:
        ends = [_ts(p.timestamp) + p.durationMs["triggerExecution"] / 1000 for p in batches]
        rows = sum(p.numInputRows for p in batches[1:])
        medians["steady_msgs_per_s"] = round(rows / max(ends[-1] - ends[0], 1e-6))
    return seconds, medians


def _ts(text: str) -> float:
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC).timestamp()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--messages", type=int, default=40_000)
    p.add_argument("--per-trigger", type=int, default=10_000, help="records per batch, total")
    p.add_argument("--version", default="4.3")
    p.add_argument("--json", type=Path, dest="json_path")
    p.add_argument("--only", choices=("streams", "queues"), help="one source and its raw client")
    a = p.parse_args(argv)
    from ackkit_testkit import own_node
    from tests._streams import declare_super_stream, publish

    n, cap = a.messages, a.per_trigger
    rows: list[dict[str, Any]] = []
    t_start = time.time()
    with own_node(a.version, streams=True) as node:
        url, port = node.url, node.stream_port  # type: ignore[attr-defined]
        spark = session()
        warm(url, n=20_000)
        items = [(f"m-{i}", BODY) for i in range(n)]
        for k in SIZES:
            name = f"bench-scale-{k}"
            if a.only != "queues":
                parts = declare_super_stream(url, name, k)
                for i, s in enumerate(parts):
                    publish(url, port, s, items[i::k])
                c0 = _cpu()
                raw_s = raw_read(url, port, parts, n)
                rows.append(_row("raw rstream", k, n, raw_s, _cpu() - c0))
                c0 = _cpu()
                raw_s = raw_read(url, port, parts, n, decode=True)
                rows.append(_row("raw rstream, decoded", k, n, raw_s, _cpu() - c0))
                c0 = _cpu()
                spark_s, spark_ms = stream_source(spark, url, port, name, cap)
                rows.append(_row("stream source", k, n, spark_s, _cpu() - c0))
                rows[-1]["spark_ms"] = spark_ms
                c0 = _cpu()
                mem_s, mem_ms = memory_source(spark, k, n, cap)
                rows.append(_row(CEILING, k, n, mem_s, _cpu() - c0))
                rows[-1]["spark_ms"] = mem_ms
            if a.only != "streams":
                queues = prefill_shards(url, f"bench.scale.{k}", k, n)
                c0 = _cpu()
                raw_s = raw_pika_all(url, queues, queue_counts(url, queues))
                rows.append(_row("raw pika", k, n, raw_s, _cpu() - c0))
                queues = prefill_shards(url, f"bench.scale.{k}", k, n)
                c0 = _cpu()
                res = drain(url, queues if k > 1 else queues[0], n, max_batch=max(cap // k, 1))
                rows.append(_row("queue source", k, n, res["seconds"], _cpu() - c0))
            print(json.dumps(rows[-6:]), flush=True)
        spark.stop()
    raw = {(r["source"], r["parallel"]): r for r in rows if r["source"].startswith("raw")}
    for r in rows:
        base = BASE.get(r["source"])
        if base:
            raw_rate = raw[(base, r["parallel"])]["msgs_per_s"]
            r["ratio_to_raw"] = round(r["msgs_per_s"] / raw_rate, 2)
            steady = r.get("spark_ms", {}).get("steady_msgs_per_s")
            if steady:
                r["steady_ratio_to_raw"] = round(steady / raw_rate, 2)
    print(f"\n{n:,} records of 200 bytes, {cap:,} per batch, RabbitMQ {a.version}")
    print(
        "| source | partitions / shards | msg/s | per partition | ratio to raw "
        "| steady msg/s (ratio) | CPU µs/msg |"
    )
    print("|---|---|---|---|---|---|---|")
    for r in sorted(rows, key=lambda r: (r["source"], r["parallel"])):
        ratio = r.get("ratio_to_raw", "")
        steady = r.get("spark_ms", {}).get("steady_msgs_per_s")
        st = f"{steady:,} ({r['steady_ratio_to_raw']})" if steady else ""
        print(
            f"| {r['source']} | {r['parallel']} | {r['msgs_per_s']:,} | {r['per_partition']:,} "
            f"| {ratio} | {st} | {r['cpu_us_per_msg']} |"
        )
    for r in rows:
        if "spark_ms" in r:
            k = r["parallel"]
            print(f"{r['source']}, {k} partition(s), median ms per batch: {r['spark_ms']}")
    if a.json_path:
        a.json_path.write_text(
            json.dumps({"messages": n, "per_trigger": cap, "rabbitmq": a.version,
                        "started": t_start, "rows": rows}, indent=2) + "\n"
        )  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
