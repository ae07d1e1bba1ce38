"""Helpers of the Spark tests: broker counts, our connection, the output set."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pika


def wait_for(cond: Callable[[], bool], timeout: float, what: str, step: float = 0.25) -> float:
    """Poll until cond() holds; return the seconds it took."""
    t0 = time.monotonic()
    while True:
        if cond():
            return time.monotonic() - t0
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(step)


def output_ids(spark: Any, output: Path) -> list[str]:
    """Every message_id in the Parquet output, duplicates included."""
    if not output.exists():
        return []
    rows = spark.read.parquet(str(output)).select("message_id").collect()
    return [r["message_id"] for r in rows]


def close_source_connection(broker: Any, queue: str) -> int:
    """Force-close the source's broker connection (found by its connection name)."""
    closed: int = broker.close_connections_named(
        f"ackkit-spark:{queue}", "ackkit spark test: reconnect"
    )
    return closed


def dlq_messages(url: str, queue: str) -> list[tuple[str | None, dict[str, Any]]]:
    """(message_id, headers) of every message in `queue` (consumed with get, acked)."""
    out = []
    conn = pika.BlockingConnection(pika.URLParameters(url))
    try:
        ch = conn.channel()
        while True:
            method, props, _body = ch.basic_get(queue, auto_ack=True)
            if method is None:
                break
            out.append((props.message_id, dict(props.headers or {})))
    finally:
        conn.close()
    return out
