"""The orders service's tests, as a user writes them: publish, wait for what the broker
shows, read the dead-letter queue. Every test runs on the pika App and on AsyncApp,
on the in-memory broker and on a real RabbitMQ (see conftest.py)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

from ackkit.testing import BrokerHandle, wait_until, wait_until_async

from .orders import Order, Stock, create_app, create_async_app


@contextlib.contextmanager
def running(broker: BrokerHandle, queue: str, stock: Stock) -> Iterator[None]:
    with create_app(broker.url, stock, queue=queue).running():
        yield


def test_an_order_reserves_stock(broker: BrokerHandle, queue: str) -> None:
    stock = Stock({"apple": 5})
    with running(broker, queue, stock):
        broker.publish(queue, Order(id=1, sku="apple", qty=2))
        broker.wait_for(queue, ready=0, unacked=0)
        wait_until(lambda: 1 in stock.reserved)
    assert stock.levels == {"apple": 3}


def test_a_malformed_order_is_dead_lettered(broker: BrokerHandle, queue: str) -> None:
    with running(broker, queue, Stock({})):
        broker.publish(queue, b"{not json", content_type="application/json")
        broker.publish(queue, {"id": 2, "sku": "apple"})  # no qty
        broker.wait_for(f"{queue}.dlq", ready=2)
    reasons = [m.reason or "" for m in broker.dead_letters(f"{queue}.dlq")]
    assert all(r.startswith("bad payload") for r in reasons), reasons


def test_a_zero_quantity_is_dead_lettered_with_its_reason(broker: BrokerHandle, queue: str) -> None:
    with running(broker, queue, Stock({"apple": 5})):
        broker.publish(queue, Order(id=3, sku="apple", qty=0))
        broker.wait_for(f"{queue}.dlq", ready=1)
    (dead,) = broker.dead_letters(f"{queue}.dlq", take=True)
    assert dead.reason == "order 3: quantity must be at least 1"
    assert dead.model(Order).id == 3
    assert dead.dead_letter is not None and dead.dead_letter.original_queue == queue


def test_missing_stock_is_retried_until_it_arrives(broker: BrokerHandle, queue: str) -> None:
    stock = Stock({"pear": 0})
    with running(broker, queue, stock):
        broker.publish(queue, Order(id=4, sku="pear", qty=1))
        wait_until(lambda: stock.misses >= 1)
        stock.levels["pear"] = 1  # arrives while the order waits for its next attempt
        wait_until(lambda: 4 in stock.reserved, timeout=10)
        broker.wait_for(queue, ready=0, unacked=0)
    assert broker.counts(f"{queue}.dlq").total == 0


def test_a_store_outage_is_retried_then_dead_lettered(broker: BrokerHandle, queue: str) -> None:
    stock = Stock({"apple": 5})
    stock.down = True
    with running(broker, queue, stock):
        broker.publish(queue, Order(id=5, sku="apple", qty=1), message_id="order-5")
        broker.wait_for(f"{queue}.dlq", ready=1)
    (dead,) = broker.dead_letters(f"{queue}.dlq")
    assert dead.dead_letter is not None
    assert (dead.dead_letter.error_type or "").endswith("StoreDown")
    assert dead.dead_letter.attempts == 4
    assert dead.properties["message_id"] == "order-5"


def test_a_repeated_order_is_reserved_once(broker: BrokerHandle, queue: str) -> None:
    stock = Stock({"apple": 5})
    with running(broker, queue, stock):
        broker.publish_many(queue, [Order(id=6, sku="apple", qty=2)] * 2)
        broker.wait_for(queue, ready=0, unacked=0)
    assert stock.levels == {"apple": 3}


def run_async(broker: BrokerHandle, queue: str, stock: Stock, scenario) -> None:  # type: ignore[no-untyped-def]
    async def main() -> None:
        app = create_async_app(broker.url, stock, queue=queue)
        await app.start()
        try:
            await scenario()
        finally:
            await app.stop()

    asyncio.run(main())


def test_async_an_order_reserves_stock(broker: BrokerHandle, queue: str) -> None:
    stock = Stock({"apple": 5})

    async def scenario() -> None:
        broker.publish(queue, Order(id=1, sku="apple", qty=2))
        await broker.wait_for_async(queue, ready=0, unacked=0)
        await wait_until_async(lambda: 1 in stock.reserved)

    run_async(broker, queue, stock, scenario)
    assert stock.levels == {"apple": 3}


def test_async_a_malformed_order_is_dead_lettered(broker: BrokerHandle, queue: str) -> None:
    async def scenario() -> None:
        broker.publish(queue, "not json at all")
        await broker.wait_for_async(f"{queue}.dlq", ready=1)

    run_async(broker, queue, Stock({}), scenario)
    (dead,) = broker.dead_letters(f"{queue}.dlq")
    assert (dead.reason or "").startswith("bad payload") and dead.text() == "not json at all"


def test_async_a_zero_quantity_is_dead_lettered(broker: BrokerHandle, queue: str) -> None:
    async def scenario() -> None:
        broker.publish(queue, Order(id=3, sku="apple", qty=0))
        await broker.wait_for_async(f"{queue}.dlq", ready=1)

    run_async(broker, queue, Stock({"apple": 1}), scenario)
    assert [m.reason for m in broker.dead_letters(f"{queue}.dlq")] == [
        "order 3: quantity must be at least 1"
    ]


def test_async_missing_stock_is_retried(broker: BrokerHandle, queue: str) -> None:
    stock = Stock({"pear": 0})

    async def scenario() -> None:
        broker.publish(queue, Order(id=4, sku="pear", qty=1))
        await wait_until_async(lambda: stock.misses >= 1)
        stock.levels["pear"] = 1
        await wait_until_async(lambda: 4 in stock.reserved)
        await broker.wait_for_async(queue, ready=0, unacked=0)

    run_async(broker, queue, stock, scenario)
    assert broker.counts(f"{queue}.dlq").total == 0


def test_async_a_store_outage_is_dead_lettered_after_four_attempts(
    broker: BrokerHandle, queue: str
) -> None:
    stock = Stock({"apple": 5})
    stock.down = True

    async def scenario() -> None:
        broker.publish(queue, Order(id=5, sku="apple", qty=1))
        await broker.wait_for_async(f"{queue}.dlq", ready=1)

    run_async(broker, queue, stock, scenario)
    (dead,) = broker.dead_letters(f"{queue}.dlq")
    assert dead.dead_letter is not None and dead.dead_letter.attempts == 4


def test_async_a_repeated_order_is_reserved_once(broker: BrokerHandle, queue: str) -> None:
    stock = Stock({"apple": 5})

    async def scenario() -> None:
        broker.publish_many(queue, [Order(id=6, sku="apple", qty=2)] * 2)
        await broker.wait_for_async(queue, ready=0, unacked=0)
        await wait_until_async(lambda: 6 in stock.reserved)

    run_async(broker, queue, stock, scenario)
    assert stock.levels == {"apple": 3}
