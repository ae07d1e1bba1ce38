"""Pull mode (basic.get): one message per call, None when the queue is empty.

Run: python -m examples.pull_mode
"""

from __future__ import annotations

from typing import Any

import ackkit

from ._common import Broker, broker_for_cli, cleanup, publish_json, table

QUEUE = "example.pull"


def main(broker: Broker) -> dict[str, Any]:
    cleanup(broker, QUEUE, f"{QUEUE}.dlq")
    publish_json(broker.url, QUEUE, [{"n": i} for i in range(3)])
    log = []
    with ackkit.connect(broker.url) as conn:
        first = conn.get(QUEUE)
        assert first is not None
        first.reject(requeue=True)  # back in the queue for any consumer
        log.append(f"{first.message_id}: rejected with requeue")
        while (d := conn.get(QUEUE)) is not None:
            d.ack()
            log.append(f"{d.message_id}: acked (attempt {d.attempt}, redelivered {d.redelivered})")
        log.append("queue empty: get() returned None")
    for line in log:
        print(f"    {line}")
    rows = table(broker, [QUEUE], "after")
    cleanup(broker, QUEUE, f"{QUEUE}.dlq")
    return {"log": log, "table": rows}


if __name__ == "__main__":
    with broker_for_cli() as b:
        main(b)
