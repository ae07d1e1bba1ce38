"""Publishing and bindings on the test kit's in-memory broker, so users' fast tests can
cover handlers that publish (the real-broker tests: tests/integration/test_publishing.py,
test_bindings.py)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

import ackkit
from ackkit import App, AsyncApp, AsyncDelivery, Delivery, Queue
from ackkit.errors import MessageUnroutable
from ackkit.testing import InMemoryBroker


def wait(pred: Any, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not pred():
        time.sleep(0.02)
    return bool(pred())


def test_a_sync_handler_publishes_and_replies_in_memory() -> None:
    with InMemoryBroker() as broker:
        app = App(broker.url, shutdown_timeout=2)

        @app.listener(Queue("orders", bind=[("shop", "order.*")]))
        def on_order(order: dict[str, Any], d: Delivery) -> None:
            app.publish("results", {"order": order["id"]})
            d.reply({"ok": order["id"]})

        with ackkit.connect(broker.url) as c:
            c.declare_queue("results")
            c.declare_queue("replies")
        with app.running():
            app.publish(
                "order.new", {"id": 7}, exchange="shop", reply_to="replies", correlation_id="c7"
            )
            with pytest.raises(MessageUnroutable):
                app.publish("invoice.new", {"id": 8}, exchange="shop")
            assert wait(lambda: len(broker.messages("replies")) == 1)
        [reply] = broker.messages("replies")
        assert reply.body == b'{"ok":7}' and reply.properties["correlation_id"] == "c7"
        assert [m.body for m in broker.messages("results")] == [b'{"order":7}']


def test_an_async_handler_publishes_in_memory() -> None:
    async def scenario(broker: InMemoryBroker) -> None:
        app = AsyncApp(broker.url, shutdown_timeout=2)

        @app.listener(Queue("orders", bind=("shop", "order.*")))
        async def on_order(order: dict[str, Any], d: AsyncDelivery) -> None:
            await d.publish("results", {"order": order["id"]})

        async with app.running():
            await app.publish("order.new", {"id": 1}, exchange="shop")
            for _ in range(200):
                if broker.messages("results"):
                    break
                await asyncio.sleep(0.02)

    with InMemoryBroker() as broker:
        with ackkit.connect(broker.url) as c:
            c.declare_queue("results")
        asyncio.run(scenario(broker))
        assert [m.body for m in broker.messages("results")] == [b'{"order":1}']
