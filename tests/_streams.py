"""Helpers of the streams tests: a stream-enabled node, streams and super streams made
over AMQP 0-9-1 (so they work on every version the kit runs), publishing and reading a
stream with plain rstream (not through the code under test)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from pathlib import Path
from typing import Any

import pika

from ackkit.streams import stream_connection


def version_of(url: str) -> tuple[int, ...]:
    conn = pika.BlockingConnection(pika.URLParameters(url))
    try:
        text = conn._impl.server_properties.get("version", b"0")
    finally:
        conn.close()
    text = text.decode() if isinstance(text, bytes) else str(text)
    return tuple(int(x) for x in text.split(".")[:2] if x.isdigit())


def declare_stream(url: str, name: str, **arguments: Any) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(url))
    try:
        conn.channel().queue_declare(
            name, durable=True, arguments={"x-queue-type": "stream", **arguments}
        )
    finally:
        conn.close()


def declare_super_stream(url: str, name: str, partitions: int, first: int = 0) -> list[str]:
    """A super stream `name` with partitions `name-<first>`..: the exchange, the partition
    streams and their ordered bindings, as RabbitMQ's own tools lay it out (3.11+).
    Called again with a larger `first`, it adds partitions."""
    conn = pika.BlockingConnection(pika.URLParameters(url))
    names = []
    try:
        ch = conn.channel()
        ch.exchange_declare(name, "direct", durable=True, arguments={"x-super-stream": True})
        for i in range(first, first + partitions):
            part = f"{name}-{i}"
            ch.queue_declare(part, durable=True, arguments={"x-queue-type": "stream"})
            ch.queue_bind(part, name, str(i), arguments={"x-stream-partition-order": i})
            names.append(part)
    finally:
        conn.close()
    return names


def delete_queues(url: str, *names: str) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(url))
    try:
        ch = conn.channel()
        for n in names:
            ch.queue_delete(n)
    finally:
        with contextlib.suppress(Exception):
            conn.close()


def publish(
    url: str, port: int, stream: str, items: list[tuple[str, bytes]], batch: int = 500
) -> None:
    """Publish (message_id, body) pairs to one stream as AMQP 1.0 messages, `batch` at a
    time, each batch confirmed by the broker before the next (plain rstream, no
    publishing ids): no chunk of the stream then spans two batches."""
    import rstream
    from rstream._pyamqp.message import Properties

    msgs = [rstream.AMQPMessage(body=b, properties=Properties(message_id=m)) for m, b in items]
    publish_records(url, port, stream, msgs, batch)


def publish_records(url: str, port: int, stream: str, records: list[Any], batch: int = 500) -> None:
    """Publish records as they are (rstream messages, or bytes stored verbatim), `batch`
    at a time, each batch confirmed by the broker before the next."""
    import rstream

    async def go() -> None:
        async with rstream.Producer(**stream_connection(url, port)) as prod:
            for i in range(0, len(records), batch):
                msgs = records[i : i + batch]
                confirmed: set[int] = set()

                def cb(st: Any, seen: set[int] = confirmed) -> None:
                    seen.add(st.message_id)

                await prod.send_batch(stream, msgs, on_publish_confirm=cb)
                deadline = time.monotonic() + 60
                while len(confirmed) < len(msgs):  # the broker confirmed every one
                    assert time.monotonic() < deadline, "publish confirms did not come"
                    await asyncio.sleep(0.01)

    if records:
        asyncio.run(go())


def read_all(url: str, port: int, stream: str, timeout: float = 5.0) -> list[tuple[int, bytes]]:
    """Every record of `stream` as (offset, raw bytes), read with a plain rstream
    subscription from the first offset until nothing more comes for `timeout` s."""
    import rstream

    out: list[tuple[int, bytes]] = []

    async def go() -> None:
        got = asyncio.Event()

        def cb(msg: Any, ctx: Any) -> None:
            out.append((ctx.offset, bytes(msg)))
            got.set()

        async with rstream.Consumer(**stream_connection(url, port)) as cons:
            spec = rstream.ConsumerOffsetSpecification(rstream.OffsetType.FIRST, None)
            await cons.subscribe(stream, cb, offset_specification=spec)
            while True:
                got.clear()
                try:
                    await asyncio.wait_for(got.wait(), timeout)
                except TimeoutError:
                    return

    asyncio.run(go())
    return out


def message_ids(url: str, port: int, stream: str, timeout: float = 5.0) -> list[str]:
    """The message ids of every record of `stream` (`read_all`: until nothing more comes
    for `timeout` s)."""
    from rstream import amqp_decoder

    ids = []
    for _off, data in read_all(url, port, stream, timeout):
        m = amqp_decoder(data)
        if m.properties is not None and m.properties.message_id is not None:
            mid = m.properties.message_id
            ids.append(mid.decode() if isinstance(mid, bytes) else str(mid))
    return ids


def last_offsets(checkpoint: Path) -> dict[str, int]:
    """The positions of the last batch Spark logged (its offset log: the truth)."""
    logs = sorted(
        (p for p in (checkpoint / "offsets").iterdir() if p.name.isdigit()),
        key=lambda p: int(p.name),
    )
    last = logs[-1].read_text().splitlines()[-1]
    return dict(json.loads(last)["positions"])
