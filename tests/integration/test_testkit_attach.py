"""attach(app) is a method of every broker handle: a test written for the in-memory
broker (``with amqp_broker.attach(app), app.running():``) runs unchanged with
``--real-broker`` (it raised AttributeError on the real broker's handle)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from ackkit import App, AsyncApp
from ackkit.testing import BrokerHandle

pytestmark = pytest.mark.integration

PRODUCTION = "amqp://svc:secret@rabbit.prod.example:5672/%2f"


def test_attach_points_an_app_at_the_real_broker(
    rabbitmq: BrokerHandle, queue_factory: Any
) -> None:
    queue = queue_factory(broker=rabbitmq)
    app = App(PRODUCTION, shutdown_timeout=5)
    seen: list[Any] = []

    @app.listener(queue)
    def handle(order: dict[str, Any]) -> None:
        seen.append(order)

    with rabbitmq.attach(app), app.running():
        assert app.url == rabbitmq.url
        rabbitmq.publish(queue, {"id": 1})
        rabbitmq.wait_for(queue, ready=0, unacked=0)
    assert seen == [{"id": 1}]
    assert app.url == PRODUCTION  # given back


def test_attach_works_for_an_async_app_on_the_real_broker(
    rabbitmq: BrokerHandle, queue_factory: Any
) -> None:
    queue = queue_factory(broker=rabbitmq)
    app = AsyncApp(PRODUCTION, shutdown_timeout=5)
    seen: list[Any] = []

    @app.listener(queue)
    async def handle(order: dict[str, Any]) -> None:
        seen.append(order)

    async def scenario() -> None:
        async with app.running():
            rabbitmq.publish(queue, {"id": 2})
            await rabbitmq.wait_for_async(queue, ready=0, unacked=0)

    with rabbitmq.attach(app):
        asyncio.run(scenario())
    assert seen == [{"id": 2}]
    assert app.url == PRODUCTION


def test_attach_refuses_a_running_app(rabbitmq: BrokerHandle, queue_factory: Any) -> None:
    queue = queue_factory(broker=rabbitmq)
    app = App(rabbitmq.url, shutdown_timeout=5)

    @app.listener(queue)
    def handle(order: dict[str, Any]) -> None: ...

    with app.running(), pytest.raises(RuntimeError, match="before starting"), rabbitmq.attach(app):
        pass
