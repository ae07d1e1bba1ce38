"""A message crosses between AMQP 0-9-1 and AMQP 1.0 on the same RabbitMQ 4.x, both ways,
and keeps its body, content type, message id, headers (application properties over 1.0)
and ackkit's attempt information; each field is read on the far side. What the broker
itself does not carry over (nested tables and arrays in 0-9-1 headers, which AMQP 1.0's
application properties cannot hold) is shown as it is."""

from __future__ import annotations

import threading
import time
from typing import Any

import pika

import ackkit
from ackkit import App, Delivery, Retry
from ackkit._sync._pika import blocking_connection, read_headers

HEADERS: dict[str, Any] = {"s": "text", "n": 7, "big": 2**40, "yes": True, "rate": 2.5}


def _wait(event: threading.Event, what: str, timeout: float = 30.0) -> None:
    assert event.wait(timeout), f"no {what} within {timeout:.0f} s"


def _get(url: str, queue: str, timeout: float = 30.0) -> tuple[Any, bytes]:
    """One message of `queue`, read over AMQP 0-9-1 (pika, its headers' wire bytes kept:
    pika itself reads a double as an int), waiting for it."""
    conn = blocking_connection(pika.URLParameters(url))
    try:
        ch = conn.channel()
        deadline = time.monotonic() + timeout
        while True:
            method, props, body = ch.basic_get(queue, auto_ack=True)
            if method is not None:
                return props, body
            assert time.monotonic() < deadline, f"nothing in {queue} within {timeout:.0f} s"
            time.sleep(0.05)
    finally:
        conn.close()


def test_published_over_0_9_1_read_over_1_0(broker4: Any, queue_factory: Any) -> None:
    q = queue_factory("to10", declare=True)
    seen: list[Delivery] = []
    got = threading.Event()
    app = App(broker4.url, protocol="amqp1.0", shutdown_timeout=2)

    @app.listener(q)
    def handle(body: bytes, d: Delivery) -> None:
        seen.append(d)
        got.set()

    headers = {**HEADERS, "ackkit-attempt": 2, "nested": {"k": 1}, "list": [1, "a"]}
    with app.running():
        with ackkit.connect(broker4.url) as conn:
            conn.publish(
                q,
                b"\x00body\xff",
                headers=headers,
                content_type="application/x-thing",
                message_id="m-1",
                correlation_id="c-1",
            )
        _wait(got, "delivery over AMQP 1.0")
    (d,) = seen
    assert d.body == b"\x00body\xff"
    assert d.properties.content_type == "application/x-thing"
    assert (d.message_id, d.properties.correlation_id) == ("m-1", "c-1")
    assert d.properties.delivery_mode == 2
    assert {k: d.headers.get(k) for k in HEADERS} == HEADERS
    assert d.attempt == 2  # ackkit's own attempt header, read over AMQP 1.0
    # RabbitMQ drops what application properties cannot hold (nested tables, arrays)
    assert "nested" not in d.headers and "list" not in d.headers


def test_published_over_1_0_read_over_0_9_1(broker4: Any, queue_factory: Any) -> None:
    q = queue_factory("from10", declare=True)
    target = queue_factory("target", declare=True)
    ready = threading.Event()
    app = App(broker4.url, protocol="amqp1.0", shutdown_timeout=2)

    @app.listener(q)
    def handle(body: bytes, d: Delivery) -> None:
        ready.set()

    with app.running():
        app.publish(
            target,
            b"\x01payload",
            headers=HEADERS,
            content_type="text/plain",
            message_id="m-2",
            correlation_id="c-2",
            persistent=False,
        )
    props, body = _get(broker4.url, target)
    assert body == b"\x01payload"
    assert props.content_type == "text/plain"
    assert (props.message_id, props.correlation_id) == ("m-2", "c-2")
    assert props.delivery_mode in (None, 1)  # transient: AMQP 1.0's durable false
    assert read_headers(props) == HEADERS  # 2.5 stays a double on the wire


# each retry copy waits 5 s in its delay queue: time enough to stop one app and start the
# next, which then takes the copy
RETRY = Retry(max_attempts=3, initial_interval=5.0, multiplier=1.0)


def _failing_once(
    url: str, q: str, protocol: str, calls: list[tuple[int, str]], done: threading.Event
) -> App:
    app = App(url, protocol=protocol, shutdown_timeout=2)

    @app.listener(q, retry=RETRY, dead_letter=q + ".dlq")
    def handle(body: bytes, d: Delivery) -> None:
        calls.append((d.attempt, protocol))
        done.set()
        raise RuntimeError(f"attempt {d.attempt} failed")

    return app


def test_the_attempt_crosses_both_ways_and_the_dead_letter_keeps_its_reason(
    broker4: Any, queue_factory: Any
) -> None:
    """Attempt 1 fails over AMQP 1.0, its retry copy waits in the delay queue; attempt 2
    runs over 0-9-1 and fails; attempt 3 runs over 1.0 again, fails, and the dead letter
    (published over 1.0) reads over 0-9-1 with ackkit's reason and attempts."""
    q = queue_factory("across", declare=True)
    order = ["amqp1.0", "amqp0-9-1", "amqp1.0"]
    calls: list[tuple[int, str]] = []
    for i, protocol in enumerate(order):
        done = threading.Event()
        app = _failing_once(broker4.url, q, protocol, calls, done)
        with app.running():
            if i == 0:
                with ackkit.connect(broker4.url) as conn:
                    conn.publish(q, b"x", message_id="m-3")
            _wait(done, f"attempt {i + 1} over {protocol}")
            broker4.wait_for(q, ready=0, unacked=0)  # settled: its copy is in the delay queue
    assert calls == [(1, "amqp1.0"), (2, "amqp0-9-1"), (3, "amqp1.0")]
    props, body = _get(broker4.url, q + ".dlq")
    assert body == b"x" and props.message_id == "m-3"
    h = props.headers
    assert h["ackkit-attempt"] == 3 and h["ackkit-reason"] == "attempts exhausted (3 of 3)"
    assert h["ackkit-error-type"] == "RuntimeError"
    assert h["ackkit-error-message"] == "attempt 3 failed"
