"""MANUAL mode: the handler settles; a forgotten settle is caught, never left unacked.

Run: python -m examples.manual_ack
"""

from __future__ import annotations

from typing import Any

from ackkit import AckMode, App, Consumer, Delivery

from ._common import Broker, broker_for_cli, cleanup, publish_json, settled, table

QUEUE = "example.manual"


def main(broker: Broker) -> dict[str, Any]:
    cleanup(broker, QUEUE, f"{QUEUE}.dlq")
    publish_json(broker.url, QUEUE, [{"n": i} for i in range(6)])
    table(broker, [QUEUE], "before")
    outcome: dict[int, str] = {}
    app = App(broker.url)

    @app.listener(QUEUE, ack_mode=AckMode.MANUAL, consumer=Consumer(prefetch=10))
    def on_message(d: Delivery) -> None:
        n = d.json()["n"]
        if n % 3 == 0:
            d.ack()
            outcome[n] = "acked"
        elif n % 3 == 1:
            d.reject(requeue=False)  # to the DLQ with its reason, not silently dropped
            outcome[n] = "rejected -> dlq"
        else:
            outcome[n] = "forgotten -> dlq (on_unsettled default)"

    with app.running():
        settled(broker, QUEUE)
        settled(broker, f"{QUEUE}.dlq", ready=4)
    rows = table(broker, [QUEUE, f"{QUEUE}.dlq"], "after")
    for n in sorted(outcome):
        print(f"    message {n}: {outcome[n]}")
    cleanup(broker, QUEUE, f"{QUEUE}.dlq")
    return {"outcome": outcome, "table": rows}


if __name__ == "__main__":
    with broker_for_cli() as b:
        main(b)
