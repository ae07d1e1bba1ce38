"""The in-memory broker hands each runtime its headers as that runtime's client library
hands them over from RabbitMQ (`ackkit.testing._memory`, "Header types"): fast, without a
node. tests/contract/test_header_types.py checks the same against RabbitMQ itself.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Iterator
from typing import Any

import pika.compat
import pytest

import ackkit
from ackkit.pull import AsyncPullConnection
from ackkit.testing import InMemoryBroker


@pytest.fixture(params=["3.13", "4.3"])
def broker(request: pytest.FixtureRequest) -> Iterator[InMemoryBroker]:
    with InMemoryBroker(rabbitmq=request.param) as b:
        yield b


def app_reads(broker: InMemoryBroker, queue: str) -> dict[str, Any]:
    with ackkit.connect(broker.url) as conn:
        d = conn.get(queue)
        assert d is not None
        d.ack()
        return dict(d.headers or {})


def async_app_reads(broker: InMemoryBroker, queue: str) -> dict[str, Any]:
    async def read() -> dict[str, Any]:
        conn = AsyncPullConnection(broker.url)
        await conn.open()
        try:
            d = await conn.get(queue)
            assert d is not None
            await d.ack()
            return dict(d.headers or {})
        finally:
            await conn.close()

    return asyncio.run(read())


def dead_letter_one(broker: InMemoryBroker, queue: str, headers: dict[str, Any]) -> None:
    """One message with `headers` rejected from `queue`.src into `queue` by the broker."""
    with broker.connect() as conn:
        ch = conn.channel()
        ch.queue_declare(queue, durable=True)
        ch.queue_declare(
            f"{queue}.src",
            durable=True,
            arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": queue},
        )
    broker.publish(f"{queue}.src", b"x", headers=headers)
    with broker.connect() as conn:
        ch = conn.channel()
        method, _, _ = ch.basic_get(f"{queue}.src")
        ch.basic_reject(method.delivery_tag, requeue=False)
    broker.wait_for(queue, ready=1)


def test_a_byte_array_is_bytes_on_app_and_a_bytearray_on_async_app(
    broker: InMemoryBroker,
) -> None:
    """aio-pika (pamqp) hands a byte-array over as a bytearray, pika as bytes: an inbox
    key, or any handler code, meets on the in-memory broker what it meets in production
    (the inbox once refused a bytearray key: only AsyncApp in production dead-lettered)."""
    headers = {"k": bytearray(b"\xff-x"), "nested": {"a": [bytearray(b"ok")]}}
    for read in (app_reads, async_app_reads):
        dead_letter_one(broker, "q", headers)
        got = read(broker, "q")
        want = bytes if read is app_reads else bytearray
        assert type(got["k"]) is want
        assert got["k"] == b"\xff-x"
        assert type(got["nested"]["a"][0]) is want


def test_broker_written_headers_have_rabbitmqs_types(broker: InMemoryBroker) -> None:
    """As RabbitMQ writes them: an x-death time is a timestamp (a datetime to both
    clients), its count a long-long (pika's `long`, as RabbitMQ's 'l' is to pika); so are
    a quorum queue's x-delivery-count (3.13) and x-acquired-count (4.3)."""
    dead_letter_one(broker, "q", {"a": 1})
    got = app_reads(broker, "q")
    (death,) = got["x-death"]
    assert isinstance(death["time"], dt.datetime)
    assert type(death["count"]) is pika.compat.long
    dead_letter_one(broker, "q", {"a": 1})
    (death,) = async_app_reads(broker, "q")["x-death"]
    assert isinstance(death["time"], dt.datetime)

    with broker.connect() as conn:
        ch = conn.channel()
        ch.queue_declare("qq", durable=True, arguments={"x-queue-type": "quorum"})
        ch.basic_publish("", "qq", b"x")
        method, _, _ = ch.basic_get("qq")
        ch.basic_reject(method.delivery_tag, requeue=True)
    counts = {k: v for k, v in app_reads(broker, "qq").items() if k.startswith("x-")}
    assert counts
    assert all(type(v) is pika.compat.long for v in counts.values()), counts


def test_dlq_inspect_shows_the_dead_letter_time_as_a_time(broker: InMemoryBroker) -> None:
    """`dead_letters()` (as `ackkit dlq inspect`) reads the x-death time as a time, not
    as a number of seconds."""
    dead_letter_one(broker, "q", {"a": 1})
    (letter,) = broker.dead_letters("q")
    assert letter.dead_letter is not None
    when = letter.dead_letter.dead_lettered_at
    assert when is not None
    assert dt.datetime.fromisoformat(when).tzinfo is not None
