"""The in-memory broker does what RabbitMQ does on a re-declare, with dead-letter cycles
and with a TTL of 0: each case runs on a real node and on the in-memory broker (under
3.13's and 4.3's rules)."""

from __future__ import annotations

import re
import time
from typing import Any

import pika
import pika.exceptions
import pytest

from ackkit import Delivery, Queue

from .conftest import IO, Broker, Runtime, eventually
from .fidelity import deaths, declare, publish, transport

pytestmark = pytest.mark.contract
__all__ = ["transport"]  # every case runs on the in-memory broker under 4.3's rules too


# -- re-declaring ------------------------------------------------------------------------------


def _redeclare(broker: Broker, name: str, args: dict[str, Any]) -> str:
    """'ok', or the reply code and the argument the broker names when it refuses."""
    conn = broker.handle.connect()
    try:
        conn.channel().queue_declare(name, durable=True, arguments=args)
        return "ok"
    except pika.exceptions.ChannelClosedByBroker as exc:
        named = re.search(r"inequivalent arg '([^']+)'", exc.reply_text)
        return f"{exc.reply_code} {named.group(1) if named else exc.reply_text}"
    finally:
        if conn.is_open:
            conn.close()


def test_redeclare_checks_only_the_arguments_rabbitmq_knows(
    broker: Broker, queue_factory: Any
) -> None:
    """A changed, added or missing custom argument passes; a changed, added or missing
    x-message-ttl, x-max-length or x-dead-letter-exchange is refused (406)."""
    q = queue_factory()
    base = {"x-custom": 1, "x-message-ttl": 60000, "x-queue-type": "classic"}
    declare(broker, q, **base)
    assert _redeclare(broker, q, {**base, "x-custom": 2}) == "ok"
    assert _redeclare(broker, q, {**base, "x-other": "new"}) == "ok"
    assert _redeclare(broker, q, {"x-message-ttl": 60000}) == "ok"  # x-custom missing
    assert _redeclare(broker, q, {**base, "x-message-ttl": 1000}) == "406 x-message-ttl"
    assert _redeclare(broker, q, {"x-custom": 1}) == "406 x-message-ttl"
    assert _redeclare(broker, q, {**base, "x-max-length": 5}) == "406 x-max-length"
    assert _redeclare(broker, q, {**base, "x-dead-letter-exchange": ""}) == (
        "406 x-dead-letter-exchange"
    )


def test_redeclare_of_a_quorum_queue_checks_its_delivery_limit(
    broker: Broker, queue_factory: Any
) -> None:
    q = queue_factory()
    base = {"x-queue-type": "quorum", "x-delivery-limit": 5, "x-custom": "a"}
    declare(broker, q, **base)
    assert _redeclare(broker, q, {**base, "x-custom": "b"}) == "ok"
    assert _redeclare(broker, q, {**base, "x-delivery-limit": 6}) == "406 x-delivery-limit"


# -- dead-letter cycles and TTL 0 --------------------------------------------------------------


def test_a_message_that_expires_into_its_own_queue_is_dropped(
    broker: Broker, queue_factory: Any
) -> None:
    """A queue that dead-letters expired messages to itself: the message comes back once
    (x-death names the queue), and on its next expiry RabbitMQ sees the cycle and drops it."""
    q = queue_factory()
    declare(
        broker,
        q,
        **{"x-message-ttl": 100, "x-dead-letter-exchange": "", "x-dead-letter-routing-key": q},
    )
    conn = broker.handle.connect()
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        publish(ch, q, b"loop")
    finally:
        conn.close()
    eventually(lambda: broker.counts(q).ready == 0, timeout=5, what="the cycle dropped")
    time.sleep(0.5)  # and it stays gone
    assert broker.counts(q).ready == 0


def test_a_two_queue_expiry_cycle_is_dropped(broker: Broker, queue_factory: Any) -> None:
    a, b = queue_factory("a"), queue_factory("b")
    for here, there in ((a, b), (b, a)):
        declare(
            broker,
            here,
            **{
                "x-message-ttl": 100,
                "x-dead-letter-exchange": "",
                "x-dead-letter-routing-key": there,
            },
        )
    conn = broker.handle.connect()
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        publish(ch, a, b"loop")
    finally:
        conn.close()

    def gone() -> bool:
        return broker.counts(a).ready == 0 and broker.counts(b).ready == 0

    eventually(gone, timeout=5, what="the cycle dropped")
    time.sleep(0.5)
    assert gone()


@pytest.mark.parametrize("kind", ["classic", "quorum"])
@pytest.mark.parametrize("ttl", ["expiration", "x-message-ttl"])
def test_a_ttl_of_0_reaches_a_waiting_consumer(
    runtime: Runtime, broker: Broker, queue_factory: Any, ttl: str, kind: str
) -> None:
    """A message with TTL 0 is delivered when a consumer can take it at once; without a
    consumer it expires at once (dead-lettered)."""
    q, dead = queue_factory(), queue_factory("dead", declare=True)
    args: dict[str, Any] = {
        "x-dead-letter-exchange": "",
        "x-dead-letter-routing-key": dead,
        "x-queue-type": kind,
    }
    props: dict[str, Any] = {}
    if ttl == "x-message-ttl":
        args["x-message-ttl"] = 0
    else:
        props["expiration"] = "0"
    declare(broker, q, **args)
    seen: list[bytes] = []

    async def handle(body: bytes, d: Delivery, io: IO) -> None:
        seen.append(body)

    app = runtime.app()
    runtime.listen(app, Queue(q, arguments=args), handle, payload=bytes)
    conn = broker.handle.connect()
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        with runtime.running(app):
            broker.wait_for(q, consumers=1)
            publish(ch, q, b"now", **props)
            eventually(lambda: seen == [b"now"], what="the TTL-0 message handled")
        broker.wait_for(q, consumers=0)
        publish(ch, q, b"nobody", **props)
    finally:
        conn.close()
    eventually(lambda: broker.counts(dead).ready == 1, what="the unconsumed one dead-lettered")
    assert broker.counts(q).ready == 0
    assert deaths(broker, dead) == [(b"nobody", "expired")]
