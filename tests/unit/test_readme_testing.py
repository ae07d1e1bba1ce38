"""docs/guide/testing.md ("Testing your service"): its in-memory examples run as written,
and what the page says the in-memory broker does (beyond tests/unit/test_memory_broker.py).
(tests/docs runs every example of every page; these check the page's claims.)"""

from __future__ import annotations

import asyncio
import re
import threading
from pathlib import Path
from typing import Any

import pytest

from ackkit import App, AsyncApp, Consumer
from ackkit.testing import BrokerError, InMemoryBroker

PAGE = Path(__file__).resolve().parents[2] / "docs" / "guide" / "testing.md"


def section_code(heading: str) -> list[str]:
    text = PAGE.read_text()
    start = text.index(f"## {heading}\n")
    end = text.index("\n## ", start + 1)
    return re.findall(r"```python\n(.*?)```", text[start:end], flags=re.S)


def test_the_sync_example_runs_as_written() -> None:
    (code, _async_code) = section_code("Fast tests without a broker")
    scope: dict[str, Any] = {}
    exec(compile(code, "docs/guide/testing.md", "exec"), scope)
    with InMemoryBroker() as broker:
        scope["test_an_order_is_handled"](broker)


def test_the_async_example_runs_as_written() -> None:
    (_code, async_code) = section_code("Fast tests without a broker")
    scope: dict[str, Any] = {}
    exec(compile(async_code, "docs/guide/testing.md", "exec"), scope)
    seen: list[Any] = []
    with InMemoryBroker() as broker:
        app = AsyncApp(broker.url, shutdown_timeout=2)

        @app.listener("orders")
        async def handle(order: dict[str, Any]) -> None:
            seen.append(order)

        asyncio.run(scope["scenario"](broker, app))
    assert seen == [{"id": 1}]


def test_close_connections_makes_the_app_reconnect() -> None:
    with InMemoryBroker() as broker:
        seen: list[int] = []
        app = App(broker.url, shutdown_timeout=2, reconnect_max_interval=0.5)

        @app.listener("orders")
        def handle(order: dict[str, Any]) -> None:
            seen.append(order["n"])

        with app.running():
            broker.publish("orders", {"n": 1})
            broker.wait_for("orders", ready=0, unacked=0)
            # the app's connection is closed under it (a reconnect can be quick enough
            # that a watcher never sees 0 consumers, so count the closed connections)
            assert broker.close_connections_named(None) >= 1
            broker.wait_for("orders", consumers=1)  # back
            broker.publish("orders", {"n": 2})
            broker.wait_for("orders", ready=0, unacked=0)
        assert seen == [1, 2]


def test_prefetch_bounds_what_a_consumer_holds() -> None:
    with InMemoryBroker() as broker:
        release = threading.Event()
        app = App(broker.url, shutdown_timeout=5)

        @app.listener("orders", consumer=Consumer(prefetch=2, concurrency=1))
        def handle(order: dict[str, Any]) -> None:
            release.wait(10)

        with app.running():
            broker.publish_many("orders", [{"n": i} for i in range(5)])
            c = broker.wait_for("orders", unacked=2)
            assert c.ready == 3
            release.set()
            broker.wait_for("orders", ready=0, unacked=0)


def test_direct_and_headers_exchanges_route() -> None:
    with InMemoryBroker() as broker, broker.connect() as conn:
        ch = conn.channel()
        for q in ("eu", "us", "big"):
            ch.queue_declare(q, durable=True)
        ch.queue_bind("eu", "amq.direct", "region.eu")
        ch.exchange_declare("by-size", "headers", durable=True)
        ch.queue_bind("big", "by-size", "", arguments={"x-match": "all", "size": "L"})
        broker.publish("region.eu", b"1", exchange="amq.direct")
        with pytest.raises(BrokerError):  # NotRouted: nothing bound to region.us
            broker.publish("region.us", b"2", exchange="amq.direct")
        broker.publish("", b"3", exchange="by-size", headers={"size": "L"})
        broker.publish("", b"4", exchange="by-size", headers={"size": "S"}, mandatory=False)
        assert [m.body for m in broker.messages("eu")] == [b"1"]
        assert [m.body for m in broker.messages("big")] == [b"3"]


def test_there_is_no_rabbitmqctl() -> None:
    with InMemoryBroker() as broker, pytest.raises(BrokerError, match="rabbitmqctl"):
        broker.ctl("list_queues")


def test_dlq_tools_and_pull_mode_take_the_memory_url() -> None:
    import ackkit

    with InMemoryBroker() as broker:
        fail = [True]
        seen: list[Any] = []
        app = App(broker.url, shutdown_timeout=2)

        @app.listener("orders")
        def handle(order: dict[str, Any]) -> None:
            if fail[0]:
                raise ValueError("boom")
            seen.append(order)

        with app.running():
            broker.publish("orders", {"id": 1})
            broker.wait_for("orders.dlq", ready=1)
            (dead,) = ackkit.dead_letters.inspect_dead_letters(broker.url, "orders.dlq")
            assert dead.error_type == "ValueError" and dead.original_queue == "orders"
            fail[0] = False
            assert ackkit.dead_letters.replay_dead_letters(broker.url, "orders.dlq").replayed == 1
            broker.wait_for("orders.dlq", ready=0)
            broker.wait_for("orders", ready=0, unacked=0)
        assert seen == [{"id": 1}]
        broker.publish("orders", {"id": 2})
        with ackkit.connect(broker.url) as conn:
            d = conn.get("orders")
            assert d is not None and d.json() == {"id": 2}
            d.ack()
        assert broker.counts("orders").total == 0
