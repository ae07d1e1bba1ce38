"""AUTO mode with a pydantic payload: return -> ack, raise -> dead-letter with the error.

Run: python -m examples.auto_ack
"""

from __future__ import annotations

import threading
from typing import Any

from pydantic import BaseModel

from ackkit import AckMode, App, Consumer, connect

from ._common import Broker, broker_for_cli, cleanup, publish_json, settled, table

QUEUE = "example.orders"


class Order(BaseModel):
    id: int
    amount: float


def main(broker: Broker) -> dict[str, Any]:
    cleanup(broker, QUEUE, f"{QUEUE}.dlq")
    orders = [{"id": i, "amount": 10.0 * i} for i in range(1, 6)]
    publish_json(broker.url, QUEUE, [*orders, {"id": 99, "amount": 1}])
    publish_json(broker.url, QUEUE, [b"this is not json", {"id": "x"}])
    table(broker, [QUEUE], "before")
    handled: list[int] = []
    lock = threading.Lock()
    app = App(broker.url)

    @app.listener(QUEUE, ack_mode=AckMode.AUTO, consumer=Consumer(prefetch=100))
    def on_order(order: Order) -> None:
        if order.id == 99:
            raise ValueError("order 99 is cursed")
        with lock:
            handled.append(order.id)

    with app.running():
        settled(broker, QUEUE)
        stats = app.stats()[f"{QUEUE}:on_order"]
    rows = table(broker, [QUEUE, f"{QUEUE}.dlq"], "after")
    reasons = []
    with connect(broker.url) as c:
        while (d := c.get(f"{QUEUE}.dlq")) is not None:
            reasons.append(str(d.headers.get("ackkit-reason")))
            print(f"    dead letter {d.body[:30]!r}: {reasons[-1]}")
            d.ack()
    print(f"  handled orders {sorted(handled)}; counters {stats}")
    cleanup(broker, QUEUE, f"{QUEUE}.dlq")
    return {
        "handled": sorted(handled),
        "dead_lettered": len(reasons),
        "reasons": reasons,
        "table": rows,
    }


if __name__ == "__main__":
    with broker_for_cli() as b:
        main(b)
