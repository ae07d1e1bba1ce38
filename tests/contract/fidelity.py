"""What the fidelity cases (test_broker_fidelity*.py) share: each runs on a real node and
on the in-memory broker under 3.13's and 4.3's rules, through a plain pika
BlockingConnection (the kit's `connect()`), asserting what the broker shows."""

from __future__ import annotations

from typing import Any

import pika
import pika.exceptions
import pytest

from .conftest import Broker


@pytest.fixture
def transport(version_transport: str) -> str:  # imported by each fidelity test module
    """Every case runs on the in-memory broker under 3.13's and 4.3's rules too."""
    return version_transport


def declare(broker: Broker, name: str, **args: Any) -> None:
    conn = broker.handle.connect()
    try:
        conn.channel().queue_declare(name, durable=True, arguments=args or None)
    finally:
        conn.close()


def publish(ch: Any, queue: str, *bodies: bytes, **props: Any) -> list[bool]:
    """Publish with confirms on `ch`; for each body, whether the broker accepted it."""
    out = []
    for b in bodies:
        try:
            ch.basic_publish("", queue, b, pika.BasicProperties(**props))
            out.append(True)
        except pika.exceptions.NackError:
            out.append(False)
    return out


def bodies(broker: Broker, queue: str) -> list[bytes]:
    return [m.body for m in broker.take_all(queue)]


def deaths(broker: Broker, queue: str) -> list[tuple[bytes, str]]:
    """(body, x-death reason) of every message in the dead-letter queue `queue`."""
    out = []
    for m in broker.take_all(queue):
        (first, *_) = m.headers["x-death"]
        reason = first["reason"]
        out.append((m.body, reason.decode() if isinstance(reason, bytes) else reason))
    return out
