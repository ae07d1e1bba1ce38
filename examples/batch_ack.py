"""A batch handler with partial success (RocketMQ's ackIndex): list in, AckIndex out.

Run: python -m examples.batch_ack
"""

from __future__ import annotations

from typing import Any

from ackkit import AckIndex, App, Batch, Consumer, Retry, RetryStrategy

from ._common import Broker, broker_for_cli, cleanup, publish_json, settled, table

QUEUE = "example.batch"


def main(broker: Broker) -> dict[str, Any]:
    cleanup(broker, QUEUE, f"{QUEUE}.dlq")
    publish_json(broker.url, QUEUE, [{"n": i} for i in range(10)])
    batches: list[list[int]] = []
    app = App(broker.url)
    retry = Retry(max_attempts=2, initial_interval=0.05, strategy=RetryStrategy.IN_PROCESS)

    @app.listener(QUEUE, consumer=Consumer(prefetch=10), batch=Batch(5, timeout=0.3), retry=retry)
    def on_batch(items: list[dict[str, int]]) -> AckIndex | None:
        ns = [x["n"] for x in items]
        batches.append(ns)
        if 7 in ns and len(batches) <= 2:
            return AckIndex(ns.index(7) - 1)  # everything before 7 is done; the rest retried
        return None

    with app.running():
        settled(broker, QUEUE)
    rows = table(broker, [QUEUE, f"{QUEUE}.dlq"], "after")
    for b in batches:
        print(f"    batch {b}")
    cleanup(broker, QUEUE, f"{QUEUE}.dlq")
    return {"batches": batches, "table": rows}


if __name__ == "__main__":
    with broker_for_cli() as b:
        main(b)
