"""A small orders service, written the way a user of ackkit would write one.

It reserves stock for each order: a malformed order or one with a quantity
below 1 is dead-lettered at once, an order whose stock is not there yet is
retried later through the broker, a failing stock store is retried and then
dead-lettered, and an order seen before is not reserved twice. The same
handlers run on the pika `App` and on `AsyncApp`.
"""

from __future__ import annotations

import threading

from pydantic import BaseModel

from ackkit import App, AsyncApp, Consumer, DeadLetterMessage, Retry, RetryLater, RetryStrategy


class Order(BaseModel):
    id: int
    sku: str
    qty: int


class StoreDown(ConnectionError):
    """The stock store did not answer."""


class Stock:
    """The service's stock store (in a real service: a database)."""

    def __init__(self, levels: dict[str, int]) -> None:
        self.levels = dict(levels)
        self.reserved: dict[int, tuple[str, int]] = {}
        self.down = False
        self.misses = 0
        self.lock = threading.Lock()

    def reserve(self, order: Order) -> None:
        if self.down:
            raise StoreDown("stock store unreachable")
        with self.lock:
            if order.id in self.reserved:
                return  # seen before: reserving is idempotent
            if self.levels.get(order.sku, 0) < order.qty:
                self.misses += 1
                raise RetryLater(f"not enough {order.sku} yet", delay=0.2)
            self.levels[order.sku] -= order.qty
            self.reserved[order.id] = (order.sku, order.qty)


RETRY = Retry(max_attempts=4, initial_interval=0.05, strategy=RetryStrategy.BROKER)


def handle(order: Order, stock: Stock) -> None:
    if order.qty < 1:
        raise DeadLetterMessage(f"order {order.id}: quantity must be at least 1")
    stock.reserve(order)


def create_app(url: str, stock: Stock, *, queue: str = "orders") -> App:
    app = App(url, connection_name="orders-service", shutdown_timeout=5)

    @app.listener(queue, retry=RETRY, consumer=Consumer(prefetch=20))
    def on_order(order: Order) -> None:
        handle(order, stock)

    return app


def create_async_app(url: str, stock: Stock, *, queue: str = "orders") -> AsyncApp:
    app = AsyncApp(url, connection_name="orders-service", shutdown_timeout=5)

    @app.listener(queue, retry=RETRY, consumer=Consumer(prefetch=20))
    async def on_order(order: Order) -> None:
        handle(order, stock)

    return app
