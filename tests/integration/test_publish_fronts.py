"""The same publish call gives the same message, whichever front takes it: on RabbitMQ.

Each front publishes; a raw pika `basic_get` reads back what the broker holds:
the body, every property and the headers must be the same for all seven (the
in-memory twin, which compares the bytes: tests/unit/test_publish_fronts.py).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pika
import pytest
from hypothesis import HealthCheck, given, settings

from ackkit.errors import MessageUnroutable
from ackkit.testing import BrokerHandle
from tests.unit._fronts import FRONTS, Fronts, fronts
from tests.unit.test_publish_fronts import bodies, options

pytestmark = [pytest.mark.integration, pytest.mark.one_leg]

PROPERTIES = (
    "content_type",
    "content_encoding",
    "headers",
    "delivery_mode",
    "priority",
    "correlation_id",
    "reply_to",
    "expiration",
    "message_id",
    "timestamp",
    "type",
    "user_id",
    "app_id",
)


@pytest.fixture(scope="module")
def real(rabbitmq: BrokerHandle) -> Iterator[tuple[Fronts, Any, str]]:
    with fronts(rabbitmq) as f:
        queue = f"fronts.table.{f.reply_to.rsplit('.', 1)[1]}"
        f.pull.declare_queue(queue)
        conn = pika.BlockingConnection(pika.URLParameters(rabbitmq.url))
        try:
            yield f, conn.channel(), queue
        finally:
            conn.channel().queue_delete(queue)
            conn.close()


def read_back(ch: Any, queue: str, n: int) -> list[tuple[bytes, dict[str, Any]]]:
    """`n` messages from `queue` as a raw client reads them: body, properties."""
    out = []
    for _ in range(n):
        method, props, body = ch.basic_get(queue, auto_ack=True)
        assert method is not None, f"only {len(out)} of {n} messages arrived"
        out.append((body, {p: getattr(props, p) for p in PROPERTIES}))
    assert ch.basic_get(queue, auto_ack=True)[0] is None
    return out


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(body=bodies, opts=options)
def test_every_front_sends_the_same_message(
    real: tuple[Fronts, Any, str], body: Any, opts: dict[str, Any]
) -> None:
    f, ch, queue = real
    for front in FRONTS:
        f.publish(front, queue, body, **opts)
    got = read_back(ch, queue, len(FRONTS))
    for front, message in zip(FRONTS, got, strict=True):
        assert message == got[0], f"{front} sent another message than {FRONTS[0]}"
    props = got[0][1]
    assert props["message_id"] == opts["message_id"]
    assert set(props["headers"] or {}) == set(opts.get("headers") or {})


def test_the_defaults_are_the_same_on_every_front(real: tuple[Fronts, Any, str]) -> None:
    f, ch, queue = real
    for body, content_type in [({"a": 1}, "application/json"), (b"\x00", None), ("t", None)]:
        for front in FRONTS:
            f.publish(front, queue, body)
        got = read_back(ch, queue, len(FRONTS))
        ids = [p.pop("message_id") for _, p in got]
        assert all(re.fullmatch("[0-9a-f]{32}", i) for i in ids), ids
        assert len(set(ids)) == len(ids)
        want = dict.fromkeys(PROPERTIES) | {"delivery_mode": 2, "content_type": content_type}
        del want["message_id"]
        assert [p for _, p in got] == [want] * len(FRONTS)


@pytest.mark.parametrize("front", FRONTS)
def test_an_unroutable_message_raises_on_every_front(
    real: tuple[Fronts, Any, str], front: str
) -> None:
    f, _, _ = real
    with pytest.raises(MessageUnroutable):
        f.publish(front, "fronts.nobody.listens", b"x")
