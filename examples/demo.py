"""`make demo`: every feature against a real broker, with the queue table before and after.

Provisions a broker the way the test kit does (AMQP_URL, else Docker, else a
throwaway local rabbitmq-server node), runs each example, then the Spark
pipeline when pyspark and Java are present.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
import time
from typing import Any

from ._common import broker_for_cli

EXAMPLES = [
    ("auto_ack", "AUTO mode: return -> ack, raise or bad payload -> dead-letter with reason"),
    ("manual_ack", "MANUAL mode: ack / reject / forgotten settle"),
    ("ack_modes", "JMS modes on AMQP: CLIENT, DUPS_OK, INDIVIDUAL, TRANSACTED"),
    ("batch_ack", "Batch handler with partial success (AckIndex)"),
    ("pull_mode", "Pull mode: basic.get, reject-requeue, ack"),
    ("retry_dead_letter", "Retry with max attempts, then the DLQ, then replay"),
    ("async_app", "AsyncApp on aio-pika: the same semantics with asyncio"),
    ("amqp10", "The App over AMQP 1.0 (RabbitMQ 4.x): the same listener, one option"),
    ("publishing", "Publishing from handlers, confirmed: a result, a reply, an unroutable one"),
    ("exchanges", "Exchanges and bindings declared by listeners; the app's AsyncAPI"),
    ("throughput", "Throughput: ackkit AUTO next to raw pika, same run"),
]


def main() -> int:
    logging.basicConfig(level=logging.ERROR, format="%(levelname)s %(name)s: %(message)s")
    only = sys.argv[1:]
    results: dict[str, Any] = {}
    with broker_for_cli() as broker:
        print(f"ackkit demo against {broker.masked_url if hasattr(broker, 'masked_url') else ''}")
        for name, title in EXAMPLES:
            if only and name not in only:
                continue
            try:
                mod = importlib.import_module(f"examples.{name}")
            except ImportError as exc:
                print(f"\n== {name}: skipped ({exc})")
                continue
            print(f"\n== {name}: {title}")
            t0 = time.monotonic()
            kw = {"n": 10_000} if name == "throughput" else {}
            results[name] = mod.main(broker, **kw)
            print(f"   ({time.monotonic() - t0:.1f} s)")
        if not only or "spark" in only:
            results["spark"] = _spark(broker)
    print("\ndemo finished")
    return 0


def _spark(broker: Any) -> Any:
    if os.environ.get("ACKKIT_DEMO_SPARK", "1") == "0":
        print("\n== spark: skipped (ACKKIT_DEMO_SPARK=0)")
        return None
    try:
        pipeline = importlib.import_module("spark.orders_pipeline")
    except ImportError as exc:
        print(f"\n== spark: skipped ({exc})")
        return None
    print("\n== spark: orders stream -> Parquet, bad rows dead-lettered, acked after commit")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    return pipeline.run_demo(broker.url, n_messages=3000, counts=broker.counts)


if __name__ == "__main__":
    raise SystemExit(main())
