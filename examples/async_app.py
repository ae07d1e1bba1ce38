"""AsyncApp on aio-pika: the same settlement semantics with asyncio and bounded concurrency.

Run: python -m examples.async_app
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

from pydantic import BaseModel

import ackkit
from ackkit import AckMode, AsyncApp, AsyncDelivery, Consumer, Retry, RetryStrategy

from ._common import Broker, broker_for_cli, cleanup, publish_json, table

QUEUE = "example.async.orders"


class Order(BaseModel):
    id: int
    amount: float


async def _run(broker: Broker) -> dict[str, Any]:
    app = AsyncApp(broker.url)
    handled: list[int] = []
    fast = Retry(max_attempts=3, initial_interval=0.05, strategy=RetryStrategy.IN_PROCESS)

    # 20 handlers at a time finish out of order; acks still only cover the settled prefix.
    @app.listener(
        QUEUE,
        ack_mode=AckMode.AUTO,
        consumer=Consumer(prefetch=50, concurrency=20),
        retry=fast,
    )
    async def on_order(order: Order) -> None:
        await asyncio.sleep(random.random() / 50)
        if order.id % 10 == 7:
            raise RuntimeError(f"order {order.id} cannot be paid")
        handled.append(order.id)

    async with app.running():
        for _ in range(300):
            c = broker.counts(QUEUE)
            if c.ready == 0 and c.unacked == 0:
                break
            await asyncio.sleep(0.1)
        stats = app.stats()[f"{QUEUE}:on_order"]
    dlq = []
    async with ackkit.aconnect(broker.url) as conn:  # pull mode, asyncio flavour
        while (d := await conn.get(f"{QUEUE}.dlq")) is not None:
            dlq.append(_describe(d))
            await d.ack()
    return {"handled": sorted(handled), "dead_lettered": dlq, "stats": stats}


def _describe(d: AsyncDelivery) -> str:
    return f"{d.json()['id']}: {d.headers.get('ackkit-reason')}"


def main(broker: Broker) -> dict[str, Any]:
    cleanup(broker, QUEUE, f"{QUEUE}.dlq")
    publish_json(broker.url, QUEUE, [{"id": i, "amount": 1.0 + i} for i in range(30)])
    table(broker, [QUEUE], "before")
    out = asyncio.run(_run(broker))
    out["table"] = table(broker, [QUEUE, f"{QUEUE}.dlq"], "after")
    print(f"    handled {len(out['handled'])} orders concurrently; dead-lettered:")
    for line in out["dead_lettered"]:
        print(f"      {line}")
    s = out["stats"]
    print(f"    acked {s['acked']} with {s['ack_frames']} ack frames, retried {s['retrying']}")
    cleanup(broker, QUEUE, f"{QUEUE}.dlq")
    return out


if __name__ == "__main__":
    with broker_for_cli() as b:
        main(b)
