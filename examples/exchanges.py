"""Exchanges and bindings: one topic exchange, two listeners bound by pattern, a fanout
exchange declared exactly, and the AsyncAPI document of the app.

Run: python -m examples.exchanges
"""

from __future__ import annotations

import contextlib
from typing import Any

import ackkit
from ackkit import App, Queue
from ackkit.topology import Bind, Exchange, ExchangeType

from ._common import Broker, broker_for_cli, cleanup, table, wait_for

EVENTS = "example.events"  # topic, declared by name
AUDIT = "example.audit"  # fanout, declared exactly
BILLING, SHIPPING, LOG = "example.billing", "example.shipping", "example.audit.log"


def build(url: str, seen: list[tuple[str, str]]) -> App:
    app = App(url)

    @app.listener(Queue(BILLING, bind=[(EVENTS, "order.*"), (EVENTS, "refund.#")]))
    def billing(event: dict[str, Any], d: ackkit.Delivery) -> None:
        seen.append(("billing", d.routing_key))

    @app.listener(Queue(SHIPPING, bind=(EVENTS, "order.paid")))
    def shipping(event: dict[str, Any], d: ackkit.Delivery) -> None:
        seen.append(("shipping", d.routing_key))

    @app.listener(Queue(LOG, bind=Bind(Exchange(AUDIT, ExchangeType.FANOUT))))
    def audit(event: dict[str, Any], d: ackkit.Delivery) -> None:
        seen.append(("audit", d.routing_key))

    return app


def main(broker: Broker) -> dict[str, Any]:
    queues = [BILLING, SHIPPING, LOG, *(f"{q}.dlq" for q in (BILLING, SHIPPING, LOG))]
    cleanup(broker, *queues)
    seen: list[tuple[str, str]] = []
    app = build(broker.url, seen)
    with app.running():
        for key in ("order.created", "order.paid", "refund.partial.eu", "stock.low"):
            with contextlib.suppress(ackkit.errors.MessageUnroutable):  # stock.low: nobody binds it
                app.publish(key, {"event": key}, exchange=EVENTS)
        app.publish("anything", {"event": "audit"}, exchange=AUDIT)
        wait_for(lambda: len(seen) == 5)
    for who, key in sorted(seen):
        print(f"    {who:<9} got {key}")
    doc = app.asyncapi(title="example")
    print(f"    AsyncAPI {doc['asyncapi']}: {len(doc['channels'])} channels")
    rows = table(broker, [BILLING, SHIPPING, LOG], "after")
    cleanup(broker, *queues)
    with ackkit.connect(broker.url) as conn:
        for ex in (EVENTS, AUDIT):
            conn.channel.exchange_delete(ex)
    return {"seen": sorted(seen), "channels": sorted(doc["channels"]), "table": rows}


if __name__ == "__main__":
    with broker_for_cli() as b:
        main(b)
