"""A message published over AMQP 1.0 by another client whose body is not bytes (an
amqp-value holding a list, a map, a number) cannot be given to a handler: the App over
AMQP 1.0 dead-letters it with the reason, the body kept as its encoded section, and the
messages after it flow. A string amqp-value is its UTF-8 bytes."""

from __future__ import annotations

import threading
import time
import urllib.parse
from typing import Any

from proton import Message
from proton.utils import BlockingConnection

from ackkit import App, Delivery


def _publish_over_amqp10(url: str, queue: str, bodies: list[Any]) -> None:
    parts = urllib.parse.urlsplit(url)
    conn = BlockingConnection(
        f"amqp://{parts.hostname}:{parts.port}",
        user=parts.username,
        password=parts.password,
        allowed_mechs="PLAIN",
        allow_insecure_mechs=True,
    )
    try:
        snd = conn.create_sender("/queues/" + urllib.parse.quote(queue, safe=""))
        for i, body in enumerate(bodies):
            snd.send(Message(body=body, id=f"m{i}"))  # waits for the broker's outcome
    finally:
        conn.close()


def test_a_body_that_is_not_bytes_is_dead_lettered_with_its_reason(
    broker4: Any, queue_factory: Any
) -> None:
    q = queue_factory("bodies", declare=True)
    seen: list[bytes] = []
    got = threading.Event()
    app = App(broker4.url, protocol="amqp1.0", shutdown_timeout=2)

    @app.listener(q, dead_letter=q + ".dlq")
    def handle(body: bytes, d: Delivery) -> None:
        seen.append(body)
        if len(seen) == 2:
            got.set()

    with app.running():
        _publish_over_amqp10(broker4.url, q, [["a", 1], "text é", {"k": 2}, b"raw"])
        assert got.wait(30), f"handled only {seen}"
        broker4.wait_for(q + ".dlq", ready=2, timeout=30)
        broker4.wait_for(q, ready=0, unacked=0)
        time.sleep(0.2)
    assert seen == ["text é".encode(), b"raw"]
    import pika

    conn = pika.BlockingConnection(pika.URLParameters(broker4.url))
    try:
        ch = conn.channel()
        dead = [ch.basic_get(q + ".dlq", auto_ack=True) for _ in range(2)]
    finally:
        conn.close()
    by_id = {p.message_id: (p.headers or {}, body) for _, p, body in dead}
    assert set(by_id) == {"m0", "m2"}
    for _mid, (headers, body) in by_id.items():
        assert "amqp-value" in headers["ackkit-reason"]
        assert body.startswith(b"\x00Sw")  # the section as it was: nothing lost
