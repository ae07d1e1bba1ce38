"""Testing without a broker: the same App and AsyncApp on the test kit's in-memory broker.

`InMemoryBroker()` runs in this process (no network, no RabbitMQ node); its
`memory://` URL is all an app needs. The test kit's helpers publish (JSON, a
pydantic model, raw bytes with properties and headers), wait for what the queues
show (blocking, or with `await`), and read the dead-letter queue with each
dead letter's reason. The same code runs against a real broker: pass its
handle to `main()` (the example test does both).

Run: python -m examples.testing_in_memory
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from pydantic import BaseModel

from ackkit import App, AsyncApp, DeadLetterMessage, Retry, RetryLater, RetryStrategy
from ackkit.testing import BrokerHandle, InMemoryBroker, wait_until_async

QUEUE = "example.memory.orders"


class Order(BaseModel):
    id: int
    qty: int


def run_sync(broker: BrokerHandle) -> dict[str, Any]:
    """The pika App: an order is handled, a bad one dead-lettered, a late one retried."""
    handled: list[int] = []
    tries: dict[int, int] = {}
    app = App(broker.url, shutdown_timeout=5)
    retry = Retry(max_attempts=3, initial_interval=0.05, strategy=RetryStrategy.BROKER)

    @app.listener(QUEUE, retry=retry)
    def on_order(order: Order) -> None:
        tries[order.id] = tries.get(order.id, 0) + 1
        if order.qty < 1:
            raise DeadLetterMessage(f"order {order.id}: quantity must be at least 1")
        if order.id == 3 and tries[order.id] == 1:
            raise RetryLater("stock not there yet")  # back after the delay queue's TTL
        handled.append(order.id)

    with app.running():
        broker.publish(QUEUE, Order(id=1, qty=2))  # a pydantic model, sent as JSON
        broker.publish(QUEUE, {"id": 2, "qty": 0})  # any JSON value
        broker.publish(QUEUE, b'{"id": 3, "qty": 1}', content_type="application/json")
        broker.wait_for(f"{QUEUE}.dlq", ready=1)
        broker.wait_for(QUEUE, ready=0, unacked=0)
        while len(handled) < 2:
            time.sleep(0.01)
    dead = broker.dead_letters(f"{QUEUE}.dlq", take=True)
    for m in dead:
        print(f"  dead letter {m.json()}: {m.reason}")
    print(f"  handled {sorted(handled)}; order 3 took {tries[3]} attempts")
    return {"handled": sorted(handled), "tries": tries, "dead": [m.reason for m in dead]}


async def run_async(broker: BrokerHandle) -> dict[str, Any]:
    """AsyncApp: `await` the queue's state instead of blocking the event loop."""
    seen: list[dict[str, Any]] = []
    app = AsyncApp(broker.url, shutdown_timeout=5)

    @app.listener(QUEUE)
    async def on_order(order: dict[str, Any]) -> None:
        seen.append(order)

    await app.start()
    try:
        broker.publish(QUEUE, {"id": 4, "qty": 1}, headers={"tenant": "eu"})
        await broker.wait_for_async(QUEUE, ready=0, unacked=0)
        await wait_until_async(lambda: len(seen) == 1)
    finally:
        await app.stop()
    print(f"  async handled {seen}")
    return {"async_handled": seen}


def main(broker: BrokerHandle | None = None) -> dict[str, Any]:
    if broker is None:
        with InMemoryBroker() as memory:
            return main(memory)
    t0 = time.monotonic()
    out = run_sync(broker)
    out.update(asyncio.run(run_async(broker)))
    out["seconds"] = time.monotonic() - t0
    out["left"] = {q: tuple(vars(broker.counts(q)).values())[:2] for q in (QUEUE, f"{QUEUE}.dlq")}
    for q in [QUEUE, f"{QUEUE}.dlq", f"{QUEUE}.retry.50ms", f"{QUEUE}.retry.100ms"]:
        broker.delete(q)
    print(f"  on {broker.kind}: {out['seconds']:.2f} s")
    return out


if __name__ == "__main__":
    main()
