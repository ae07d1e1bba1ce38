"""A handler reads a producer's float and double headers as floats, on a real broker,
App and AsyncApp alike (App's handlers read 2.5 as 2 and 1.0 as 1: pika's decoder calls
int() on them); the other headers are as before."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from _apps import Runner

import ackkit
from ackkit import App, AsyncApp, AsyncDelivery, Delivery

pytestmark = [pytest.mark.integration, pytest.mark.one_leg]

HEADERS: dict[str, Any] = {
    "rate": 2.5,
    "one": 1.0,
    "count": 7,
    "name": "x",
    "nested": {"ratio": 0.25, "n": 3},
    "list": [1.5, 2, "a"],
}


def _publish(url: str, queue: str) -> None:
    """Doubles on the wire, as a producer in another language sends them (pika itself
    cannot encode a float header; ackkit's publisher can)."""
    with ackkit.connect(url) as conn:
        conn.publish(queue, b"{}", headers=HEADERS)


@pytest.mark.parametrize("kind", [App, AsyncApp], ids=["App", "AsyncApp"])
def test_a_handler_reads_float_headers_as_floats(
    kind: type[App] | type[AsyncApp], rabbitmq: Any, queue_factory: Any
) -> None:
    q = queue_factory("floats")
    seen: list[dict[str, Any]] = []
    got = threading.Event()
    app = kind(rabbitmq.url, shutdown_timeout=2)

    if kind is App:

        @app.listener(q)
        def handle(body: dict[str, Any], delivery: Delivery) -> None:
            seen.append(dict(delivery.headers))
            got.set()

    else:

        @app.listener(q)
        async def ahandle(body: dict[str, Any], delivery: AsyncDelivery) -> None:
            seen.append(dict(delivery.headers))
            got.set()

    runner = Runner(app)
    runner.start()
    try:
        _publish(rabbitmq.url, q)
        assert got.wait(30), "the handler never ran"
        rabbitmq.wait_for(q, ready=0, unacked=0)
    finally:
        runner.stop()
    (h,) = seen
    assert [(k, h[k], type(h[k])) for k in ("rate", "one")] == [
        ("rate", 2.5, float),
        ("one", 1.0, float),
    ]
    assert h["nested"] == {"ratio": 0.25, "n": 3} and isinstance(h["nested"]["ratio"], float)
    assert h["list"][0] == 1.5 and isinstance(h["list"][0], float)
    assert h["count"] == 7 and h["list"][1:] == [2, "a"]
    assert h["name"] in ("x", b"x")
