"""The App over AMQP 1.0 (RabbitMQ 4.0 or later): the same listener, one option changed.

Six orders: most are handled on attempt 1; order 2 fails once and goes through on
attempt 2 (its retry copy waited in the delay queue, published over AMQP 1.0 and
confirmed by the broker's outcome); order 4 always fails and is dead-lettered after 3
attempts with its reason. On RabbitMQ 3.x the example says why it does not run:
`App(..., protocol="amqp1.0")` refuses 3.x at start, naming the version.

Run: python -m examples.amqp10   (ACKKIT_TEST_RABBITMQ=4.3 for a 4.3 node of the kit's own)
"""

from __future__ import annotations

from typing import Any

from ackkit import App, Delivery, Retry

from ._common import Broker, broker_for_cli, cleanup, publish_json, settled, table

QUEUE = "example.amqp10"
DLQ = f"{QUEUE}.dlq"


class Flaky(Exception):
    """A downstream call that failed this time."""


def main(broker: Broker) -> dict[str, Any]:
    version = broker.server_version()
    if int(version.split(".")[0]) < 4:
        print(f"    skipped: AMQP 1.0 needs RabbitMQ 4.0 or later, this broker is {version}")
        return {"skipped": version}
    cleanup(broker, QUEUE, DLQ)
    publish_json(broker.url, QUEUE, [{"n": i} for i in range(6)])
    table(broker, [QUEUE], "before")
    attempts: dict[int, list[int]] = {}
    app = App(broker.url, protocol="amqp1.0")

    @app.listener(QUEUE, retry=Retry(max_attempts=3, initial_interval=0.2), dead_letter=DLQ)
    def on_order(order: dict[str, int], d: Delivery) -> None:
        n = order["n"]
        attempts.setdefault(n, []).append(d.attempt)
        if n == 4 or (n == 2 and d.attempt == 1):
            raise Flaky(f"order {n}: the downstream call failed")

    with app.running():
        settled(broker, QUEUE)
        settled(broker, DLQ, ready=1)
    rows = table(broker, [QUEUE, DLQ], "after")
    for n in sorted(attempts):
        print(f"    order {n}: attempts {attempts[n]}")
    cleanup(broker, QUEUE, DLQ, *(f"{QUEUE}.retry.{ms}ms" for ms in (200, 400)))
    return {"attempts": attempts, "table": rows}


if __name__ == "__main__":
    with broker_for_cli() as b:
        main(b)
