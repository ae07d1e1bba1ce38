"""The stream source's broker I/O (rstream, asyncio): it only carries out what the
pure planning in `ackkit._core.stream_offsets` decided.

rstream is asyncio; Spark's processes are not. Every call here runs on a private event
loop of its own (`run`), opened and closed with the call, so nothing is shared across
a fork, a pickle or a thread: the driver's probes and each executor's read open their
own connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from typing import Any, TypeVar

from .._core.stream_offsets import Range, RangeCursor

log = logging.getLogger("ackkit.spark.streams")
T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run `coro` on a private event loop (closed afterwards)."""
    return asyncio.run(coro)


def _rstream() -> Any:
    try:
        import rstream
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(
            "the rabbitmq-stream source needs rstream: pip install 'ackkit[streams]'"
        ) from exc
    return rstream


def _consumer(conn: dict[str, Any], name: str) -> Any:
    rs = _rstream()
    return rs.Consumer(**conn, connection_name=f"ackkit-stream:{name}", max_retries=3)


async def partitions(conn: dict[str, Any], super_stream: str) -> list[str]:
    """The partition streams of a super stream, as the broker lists them."""
    consumer = _consumer(conn, "partitions")
    try:
        client = await consumer.default_client
        return list(await client.partitions(super_stream))
    finally:
        await consumer.close()


async def stream_exists(conn: dict[str, Any], stream: str) -> bool:
    consumer = _consumer(conn, "exists")
    try:
        return bool(await consumer.stream_exists(stream))
    finally:
        await consumer.close()


async def probe(
    conn: dict[str, Any], streams: Iterable[str], kind: str, timeout: float, at: int | None = None
) -> dict[str, int]:
    """One offset per stream, read from a short subscription (all streams at once).

    kind "first": the first offset the stream holds; "tail": one past the highest
    offset seen in the last chunk (the next offset to be written: a lower bound if the
    stream grows meanwhile); "timestamp": the first offset of the first chunk written
    at or after `at` (epoch ms). A stream that delivers nothing within `timeout` seconds
    is left out (empty, or nothing at or after the timestamp)."""
    rs = _rstream()
    spec = {
        "first": rs.ConsumerOffsetSpecification(rs.OffsetType.FIRST, None),
        "tail": rs.ConsumerOffsetSpecification(rs.OffsetType.LAST, None),
        "timestamp": rs.ConsumerOffsetSpecification(rs.OffsetType.TIMESTAMP, at),
    }[kind]
    consumer = _consumer(conn, f"probe-{kind}")
    found: dict[str, int] = {}
    events: dict[str, asyncio.Event] = {}

    def on_message(stream: str) -> Callable[[Any, Any], None]:
        def cb(_msg: Any, ctx: Any) -> None:
            if kind == "tail":
                found[stream] = max(found.get(stream, 0), ctx.offset + 1)
            else:
                found.setdefault(stream, ctx.offset)
            events[stream].set()

        return cb

    try:
        names = list(streams)
        for s in names:
            events[s] = asyncio.Event()
            await consumer.subscribe(s, on_message(s), offset_specification=spec, initial_credit=1)
        waits = [asyncio.wait_for(events[s].wait(), timeout) for s in names]
        for res in await asyncio.gather(*waits, return_exceptions=True):
            if isinstance(res, BaseException) and not isinstance(res, asyncio.TimeoutError):
                raise res
        return {s: found[s] for s in names if s in found}
    finally:
        await consumer.close()


async def read_range(
    conn: dict[str, Any],
    rng: Range,
    timeout: float,
    sink: Callable[[int, int, bytes], Awaitable[None] | None],
) -> RangeCursor:
    """Deliver every record of `rng` to `sink(offset, chunk_timestamp_ms, data)`, in
    offset order; returns the cursor (its `gaps`: offsets not delivered). A
    TimeoutError when nothing of the range came for `timeout` seconds."""
    rs = _rstream()
    cursor = RangeCursor(rng)
    consumer = _consumer(conn, f"read-{rng.stream}")
    done = asyncio.Event()
    progress = asyncio.Event()
    failure: list[BaseException] = []

    async def cb(msg: Any, ctx: Any) -> None:
        if done.is_set():
            return
        try:
            if cursor.offer(ctx.offset):
                maybe = sink(ctx.offset, ctx.timestamp, bytes(msg))
                if maybe is not None:
                    await maybe
        except BaseException as exc:  # surfaced by read_range, not swallowed by rstream
            failure.append(exc)
            done.set()
        progress.set()
        if cursor.done:
            done.set()

    try:
        spec = rs.ConsumerOffsetSpecification(rs.OffsetType.OFFSET, rng.first)
        await consumer.subscribe(rng.stream, cb, offset_specification=spec, initial_credit=10)
        while not done.is_set():
            progress.clear()
            try:
                await asyncio.wait_for(progress.wait(), timeout)
            except TimeoutError:
                raise TimeoutError(
                    f"stream {rng.stream!r}: no record of offsets {cursor.expected}.."
                    f"{rng.until - 1} came within {timeout:.0f} s"
                ) from None
        if failure:
            raise failure[0]
        return cursor
    finally:
        with contextlib.suppress(Exception):
            await consumer.close()


async def store_offsets(conn: dict[str, Any], reference: str, positions: dict[str, int]) -> None:
    """Store positions on the broker under `reference` (the last offset read: position-1)."""
    consumer = _consumer(conn, "store")
    try:
        for stream, pos in positions.items():
            if pos > 0:
                await consumer.store_offset(stream, reference, pos - 1)
    finally:
        await consumer.close()
