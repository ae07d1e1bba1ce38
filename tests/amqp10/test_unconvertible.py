"""Messages RabbitMQ cannot convert for AMQP 1.0 (a decimal header, seen on 4.3): the
broker ends the App's AMQP 1.0 connection as it tries to deliver one. The runtime then
takes the queue's head over AMQP 0-9-1 (`ackkit._core.conversion`), so each such
message reaches the handler as published, with its headers, and the listener goes on
over AMQP 1.0: on a classic queue (where nothing else would end it) and on a quorum
queue, before its delivery limit would."""

from __future__ import annotations

import decimal
import logging
import threading
from typing import Any

import pika
import pytest

from ackkit import App, Consumer, Delivery, Queue

CULPRITS = {15: decimal.Decimal("1.50"), 30: decimal.Decimal("-7")}
N = 40


@pytest.mark.parametrize("queue_type", ["classic", "quorum"])
def test_a_message_the_broker_cannot_convert_is_handled_and_consuming_goes_on(
    broker4: Any, queue_factory: Any, queue_type: str, caplog: pytest.LogCaptureFixture
) -> None:
    args = {"x-queue-type": queue_type}
    q = queue_factory("conv", declare=True, arguments=args)
    seen: list[bytes] = []
    headers: dict[bytes, Any] = {}
    lock = threading.Lock()
    app = App(broker4.url, protocol="amqp1.0", shutdown_timeout=2)

    @app.listener(Queue(q, arguments=args), dead_letter=q + ".dlq", consumer=Consumer(prefetch=10))
    def handle(body: bytes, d: Delivery) -> None:
        with lock:
            seen.append(body)
            headers[body] = d.headers

    bc = pika.BlockingConnection(pika.URLParameters(broker4.url))
    try:
        ch = bc.channel()
        for i in range(N):
            if i in CULPRITS:
                props = pika.BasicProperties(headers={"price": CULPRITS[i]})
                ch.basic_publish("", q, f"decimal-{i}".encode(), props)
            ch.basic_publish("", q, f"m{i}".encode())
    finally:
        bc.close()
    want = {f"m{i}".encode() for i in range(N)} | {f"decimal-{i}".encode() for i in CULPRITS}
    caplog.set_level(logging.WARNING, logger="ackkit")
    with app.running():
        broker4.wait_for(q, ready=0, unacked=0, timeout=60)
        with lock:
            assert set(seen) == want
    # each culprit handled as published, its decimal header read over AMQP 0-9-1
    for i, price in CULPRITS.items():
        assert headers[f"decimal-{i}".encode()]["price"] == price
    # at most once more each (a connection loss redelivers what was in flight), and the
    # connection ended once per culprit at most: never a loop
    assert all(seen.count(b) <= 2 for b in seen), sorted(seen)
    ends = [r for r in caplog.records if "taking up to" in r.getMessage()]
    assert 1 <= len(ends) <= len(CULPRITS), [r.getMessage() for r in ends]
    assert broker4.counts(q).total == 0 and broker4.counts(q + ".dlq").total == 0
