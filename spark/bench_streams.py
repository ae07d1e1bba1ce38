"""Throughput of the rabbitmq-stream source next to a raw rstream consumer, same data.

    python -m spark.bench_streams --messages 50000 [--partitions 3] [--version 4.3]

Starts a throwaway node of the test kit's own with the stream plugin (super streams:
3.11+, so 4.3 by default; `--partitions 0` reads one plain stream on any version),
publishes the records once, then times (1) plain rstream subscriptions reading every
partition to its end, concurrently, and (2) a Spark query (local[2], AvailableNow,
`max_messages_per_trigger`) reading the same records into a counting foreachBatch.
Spark's start-up is outside the timed part. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import ackkit.spark as aks
from ackkit.streams import stream_connection

BODY = (b"ackkit benchmark payload 0123456789 abcdefghijklmnopqrstuvwxyz. " * 4)[:200]


def raw_read(url: str, port: int, streams: list[str], total: int, *, decode: bool = False) -> float:
    """Seconds for plain rstream subscriptions to receive `total` records (`decode`: and
    decode each one's AMQP 1.0 message, as a consumer needing its message id must)."""
    import rstream

    async def go() -> float:
        seen = 0
        done = asyncio.Event()

        def cb(msg: Any, _ctx: Any) -> None:
            nonlocal seen
            if decode:
                m = rstream.amqp_decoder(bytes(msg))
                if m.properties is None or m.properties.message_id is None:
                    return
            seen += 1
            if seen >= total:
                done.set()

        t0 = time.perf_counter()
        async with rstream.Consumer(**stream_connection(url, port)) as c:
            spec = rstream.ConsumerOffsetSpecification(rstream.OffsetType.FIRST, None)
            for s in streams:
                await c.subscribe(s, cb, offset_specification=spec, initial_credit=10)
            await asyncio.wait_for(done.wait(), 600)
            return time.perf_counter() - t0

    return asyncio.run(go())


def spark_read(spark: Any, url: str, port: int, where: dict[str, str], per_trigger: int) -> float:
    rows = [0]

    def count(df: Any, _batch: int) -> None:
        rows[0] += df.count()

    with tempfile.TemporaryDirectory(prefix="ackkit-bench-streams-") as d:
        df = aks.read_stream_source(
            spark,
            url=url,
            checkpoint=Path(d) / "ck",
            stream_port=port,
            max_messages_per_trigger=per_trigger,
            **where,
        )
        t0 = time.perf_counter()
        q = (
            df.select("offset")
            .writeStream.foreachBatch(count)
            .option("checkpointLocation", str(Path(d) / "ck"))
            .trigger(availableNow=True)
            .start()
        )
        q.awaitTermination()
        took = time.perf_counter() - t0
    if q.exception() is not None:
        raise RuntimeError(str(q.exception()))
    return took if rows[0] else float("nan")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--messages", type=int, default=50_000)
    p.add_argument("--partitions", type=int, default=3)
    p.add_argument("--per-trigger", type=int, default=20_000)
    p.add_argument("--version", default="4.3")
    a = p.parse_args(argv)
    from ackkit_testkit import own_node
    from spark.orders_pipeline import spark_session
    from tests._streams import declare_stream, declare_super_stream, publish

    with own_node(a.version, streams=True) as node:
        url, port = node.url, node.stream_port  # type: ignore[attr-defined]
        if a.partitions:
            streams = declare_super_stream(url, "bench", a.partitions)
            where = {"super_stream": "bench"}
        else:
            declare_stream(url, "bench")
            streams, where = ["bench"], {"stream": "bench"}
        items = [(f"m-{i}", BODY) for i in range(a.messages)]
        for i, s in enumerate(streams):
            publish(url, port, s, items[i :: len(streams)])
        raw_s = raw_read(url, port, streams, a.messages)
        spark = spark_session("ackkit-bench-streams")
        try:
            spark_s = spark_read(spark, url, port, where, a.per_trigger)
        finally:
            spark.stop()
    out = {
        "messages": a.messages,
        "partitions": a.partitions,
        "rabbitmq": a.version,
        "raw_rstream_msgs_per_s": round(a.messages / raw_s),
        "spark_source_msgs_per_s": round(a.messages / spark_s),
        "ratio": round(raw_s / spark_s, 3),
    }
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
