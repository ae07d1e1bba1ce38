"""Publishing: a topic-exchange consumer that publishes its result and replies to the
sender, every publish confirmed by the broker.

Run: python -m examples.publishing
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel

import ackkit
from ackkit import App, Delivery, Queue
from ackkit.errors import MessageUnroutable

from ._common import Broker, broker_for_cli, cleanup, table, wait_for

EXCHANGE = "example.shop"
ORDERS, INVOICES, REPLIES = "example.pub.orders", "example.pub.invoices", "example.pub.replies"


class Order(BaseModel):
    id: int
    amount: float


class Invoice(BaseModel):
    order: int
    total: float


def main(broker: Broker) -> dict[str, Any]:
    queues = [ORDERS, INVOICES, REPLIES, f"{ORDERS}.dlq", f"{INVOICES}.dlq"]
    cleanup(broker, *queues)
    app = App(broker.url)

    # The queue is bound to the topic exchange before consuming starts; the exchange is
    # declared (durable, topic) if it does not exist yet.
    @app.listener(Queue(ORDERS, bind=[(EXCHANGE, "order.created")]))
    def on_order(order: Order, delivery: Delivery) -> None:
        invoice = Invoice(order=order.id, total=round(order.amount * 1.2, 2))
        # Confirmed before this delivery is acked: a crash in between redelivers the
        # order, it never loses the invoice.
        app.publish(INVOICES, invoice, headers={"source": "on_order"})
        if delivery.properties.reply_to:
            delivery.reply({"accepted": order.id})

    @app.listener(INVOICES)
    def on_invoice(invoice: Invoice) -> None:
        print(f"    invoice for order {invoice.order}: {invoice.total}")

    with ackkit.connect(broker.url) as conn:
        conn.declare_queue(REPLIES)
    unroutable = ""
    with app.running():
        for i in range(1, 4):
            app.publish(
                "order.created",
                Order(id=i, amount=10.0 * i),
                exchange=EXCHANGE,
                reply_to=REPLIES,
                correlation_id=f"req-{i}",
            )
        try:  # nothing is bound for this routing key: the broker returns it
            app.publish("order.cancelled", {"id": 1}, exchange=EXCHANGE)
        except MessageUnroutable as exc:
            unroutable = str(exc)
            print(f"    {type(exc).__name__}: {exc}")
        wait_for(lambda: broker.counts(REPLIES).ready == 3)
        wait_for(lambda: broker.counts(ORDERS).total == 0 and broker.counts(INVOICES).total == 0)
    replies = []
    with ackkit.connect(broker.url) as conn:
        while (d := conn.get(REPLIES)) is not None:
            replies.append((d.properties.correlation_id, json.loads(d.body)))
            d.ack()
    for corr, body in replies:
        print(f"    reply {corr}: {body}")
    rows = table(broker, [ORDERS, INVOICES, REPLIES], "after")
    cleanup(broker, *queues)
    with ackkit.connect(broker.url) as conn:
        conn.channel.exchange_delete(EXCHANGE)
    return {"replies": sorted(replies), "unroutable": unroutable, "table": rows}


if __name__ == "__main__":
    with broker_for_cli() as b:
        main(b)
