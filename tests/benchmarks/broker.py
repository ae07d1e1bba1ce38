"""Broker-side helpers of the harness: declare, pre-fill, inspect and delete queues.

Everything here runs in the harness process and is never timed. Case ``setup`` /
``check`` / ``cleanup`` hooks can reuse these functions.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import pika
from pika.adapters.blocking_connection import BlockingChannel
from pika.exceptions import ChannelClosedByBroker

from .cases import BODY_SIZE

#: Arguments of every queue the harness declares: durable classic queues.
CLASSIC_ARGUMENTS: dict[str, Any] = {"x-queue-type": "classic"}

PUBLISH_BATCH = 1000


def body(size: int = BODY_SIZE) -> bytes:
    """A deterministic ASCII body of ``size`` bytes.

    Plain text without a content type: every client under test (kombu decodes bodies
    as UTF-8 by default) accepts it without extra configuration.
    """
    pattern = b"ackkit benchmark payload 0123456789 abcdefghijklmnopqrstuvwxyz. "
    return (pattern * (size // len(pattern) + 1))[:size]


def reachable(url: str, timeout: float = 2.0) -> bool:
    """Whether something accepts TCP connections at the URL's host and port."""
    parts = urlsplit(url)
    host = parts.hostname or "127.0.0.1"
    port = parts.port or (5671 if parts.scheme == "amqps" else 5672)
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


@contextmanager
def channel(url: str) -> Iterator[BlockingChannel]:
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        yield connection.channel()
    finally:
        if connection.is_open:
            connection.close()


def broker_info(url: str) -> dict[str, str]:
    """Product and version the broker announces on connect."""
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        props: dict[Any, Any] = connection._impl.server_properties or {}
    finally:
        connection.close()

    def text(key: str) -> str:
        value = props.get(key, "")
        return value.decode() if isinstance(value, bytes) else str(value)

    return {"product": text("product"), "version": text("version")}


def declare_queue(url: str, queue: str, arguments: dict[str, Any] | None = None) -> None:
    """Declare a durable classic queue (plus ``arguments``)."""
    with channel(url) as ch:
        ch.queue_declare(queue, durable=True, arguments={**CLASSIC_ARGUMENTS, **(arguments or {})})


@dataclass(frozen=True)
class QueueState:
    ready: int
    consumers: int


def queue_state(url: str, queue: str) -> QueueState | None:
    """Ready-message and consumer counts (passive declare); ``None`` if no such queue."""
    try:
        with channel(url) as ch:
            ok = ch.queue_declare(queue, passive=True).method
    except ChannelClosedByBroker as exc:
        if exc.reply_code == 404:
            return None
        raise
    return QueueState(ready=ok.message_count, consumers=ok.consumer_count)


def wait_settled(url: str, queue: str, timeout: float = 10.0) -> QueueState | None:
    """Wait until the queue has no consumer (so unacked messages were requeued).

    A consumer's unacked messages go back to "ready" when its channel closes, which
    the broker does at the latest when the worker process's socket closes. Once the
    consumer count is 0, the ready count is final.
    """
    deadline = time.monotonic() + timeout
    while True:
        state = queue_state(url, queue)
        if state is None or state.consumers == 0 or time.monotonic() > deadline:
            return state
        time.sleep(0.1)


def delete_queue(url: str, queue: str) -> None:
    with channel(url) as ch:
        ch.queue_delete(queue)


async def _publish(url: str, queue: str, n: int, payload: bytes) -> None:
    import aio_pika

    connection = await aio_pika.connect(url)
    try:
        ch = await connection.channel(publisher_confirms=True)
        exchange = ch.default_exchange
        sent = 0
        while sent < n:
            batch = min(PUBLISH_BATCH, n - sent)
            await asyncio.gather(
                *(
                    exchange.publish(
                        aio_pika.Message(payload, delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
                        routing_key=queue,
                    )
                    for _ in range(batch)
                )
            )
            sent += batch
    finally:
        await connection.close()


def publish(url: str, queue: str, n: int, size: int = BODY_SIZE) -> None:
    """Publish ``n`` persistent messages to ``queue`` with confirms, in batches."""
    if n > 0:
        asyncio.run(_publish(url, queue, n, body(size)))


def prefill(
    url: str,
    queue: str,
    n: int,
    size: int = BODY_SIZE,
    arguments: dict[str, Any] | None = None,
) -> None:
    """Declare ``queue`` and fill it with ``n`` persistent messages; verify the count."""
    declare_queue(url, queue, arguments)
    publish(url, queue, n, size)
    state = queue_state(url, queue)
    if state is None or state.ready != n:
        raise RuntimeError(f"pre-fill of {queue}: expected {n} ready, broker says {state}")


# -- default and stock hooks ---------------------------------------------------------


def default_setup(url: str, queue: str, n: int) -> None:
    prefill(url, queue, n)


def empty_setup(url: str, queue: str, n: int) -> None:
    declare_queue(url, queue)


def check_drained(url: str, queue: str, n: int) -> str | None:
    """Valid when no consumer is left and no message is ready: every ack landed."""
    state = wait_settled(url, queue)
    if state is None:
        return "queue vanished"
    if state.consumers:
        return f"{state.consumers} consumer(s) still attached"
    if state.ready:
        return f"{state.ready} msgs left in queue (acks lost?)"
    return None


def check_published(url: str, queue: str, n: int) -> str | None:
    """Valid when exactly ``n`` messages sit in the queue (publishing cases)."""
    state = wait_settled(url, queue)
    if state is None:
        return "queue vanished"
    if state.ready != n:
        return f"expected {n} messages in the queue, found {state.ready}"
    return None


def default_cleanup(url: str, queue: str, n: int) -> None:
    delete_queue(url, queue)
