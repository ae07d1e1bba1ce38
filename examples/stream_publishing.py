"""Publishing to a RabbitMQ stream effectively once: a producer "crashes" after the
broker confirmed a batch it never recorded, restarts, and publishes the whole batch
again with the same publishing ids; the stream holds every message once.

Needs a broker with the rabbitmq_stream plugin. Run: python -m examples.stream_publishing
(it starts a throwaway node of the test kit's own with the plugin).
"""

from __future__ import annotations

import asyncio
from typing import Any

from ackkit.streams import StreamMessage, StreamPublisher, stream_connection

STREAM = "example.stream.orders"
PRODUCER = "orders-exporter"  # the name the broker deduplicates by


def outbox(first: int, last: int) -> list[tuple[int, StreamMessage]]:
    """The application's own durable sequence: (publishing id, message)."""
    return [
        (i, StreamMessage(f'{{"order": {i}}}'.encode(), message_id=f"order-{i}"))
        for i in range(first, last + 1)
    ]


def count(url: str, port: int) -> int:
    """How many messages the stream holds (read with plain rstream)."""
    import rstream

    async def go() -> int:
        seen: list[int] = []
        got = asyncio.Event()

        def cb(_msg: Any, ctx: Any) -> None:
            seen.append(ctx.offset)
            got.set()

        async with rstream.Consumer(**stream_connection(url, port)) as c:
            spec = rstream.ConsumerOffsetSpecification(rstream.OffsetType.FIRST, None)
            await c.subscribe(STREAM, cb, offset_specification=spec)
            while True:
                got.clear()
                try:
                    await asyncio.wait_for(got.wait(), 2.0)
                except TimeoutError:
                    return len(seen)

    return asyncio.run(go())


def main(url: str, stream_port: int) -> dict[str, Any]:
    import pika

    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    ch.queue_delete(STREAM)
    ch.queue_declare(STREAM, durable=True, arguments={"x-queue-type": "stream"})
    conn.close()

    # Run 1: publishes orders 1..100 (confirmed), then dies before recording that.
    with StreamPublisher(url, stream=STREAM, name=PRODUCER, stream_port=stream_port) as pub:
        pub.publish(outbox(1, 100))
    # Run 2: does not know how far run 1 got; publishes 1..150 again.
    with StreamPublisher(url, stream=STREAM, name=PRODUCER, stream_port=stream_port) as pub:
        before = pub.last_publishing_id()
        confirmed = pub.publish(outbox(1, 150))
        after = pub.last_publishing_id()
    stored = count(url, stream_port)
    print(f"    broker's last id before run 2: {before}, after: {after}")
    print(f"    run 2 had {confirmed} messages confirmed; the stream holds {stored}")
    conn = pika.BlockingConnection(pika.URLParameters(url))
    conn.channel().queue_delete(STREAM)
    conn.close()
    return {"before": before, "after": after, "confirmed": confirmed, "stored": stored}


if __name__ == "__main__":
    from ackkit_testkit import own_node

    with own_node(streams=True) as node:
        main(node.url, node.stream_port)  # type: ignore[attr-defined]
