"""Throughput: ackkit's AUTO listener next to raw pika with batched acks, same broker, same run.

Run: python -m examples.throughput [N]
"""

from __future__ import annotations

import sys
import time
from typing import Any

import pika

from ackkit import App

from ._common import Broker, broker_for_cli, cleanup, wait_for

QUEUE = "example.throughput"
BODY = b'{"id": 1, "amount": 12.5, "pad": "' + b"x" * 160 + b'"}'


def _fill(url: str, n: int) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    ch.queue_declare(QUEUE, durable=True)
    props = pika.BasicProperties(delivery_mode=2, content_type="application/json")
    for i in range(n):
        ch.basic_publish("", QUEUE, BODY, props)
        if i % 1000 == 999:
            conn.process_data_events(0)
    while ch.queue_declare(QUEUE, durable=True, passive=True).method.message_count < n:
        time.sleep(0.05)
    conn.close()


def _raw_pika(url: str, n: int) -> float:
    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    ch.basic_qos(prefetch_count=1000)
    count = 0
    t0 = time.perf_counter()

    def on_message(ch: Any, method: Any, props: Any, body: bytes) -> None:
        nonlocal count
        count += 1
        if count % 100 == 0 or count == n:
            ch.basic_ack(method.delivery_tag, multiple=True)
        if count == n:
            ch.stop_consuming()

    ch.basic_consume(QUEUE, on_message)
    ch.start_consuming()
    dt = time.perf_counter() - t0
    conn.close()
    return n / dt


def _ackkit(broker: Broker, n: int) -> float:
    app = App(broker.url)
    count = 0

    @app.listener(QUEUE)  # defaults: AUTO, prefetch 250, batched multiple-ack
    def on_message(body: bytes) -> None:
        nonlocal count
        count += 1

    app.start()
    t0 = time.perf_counter()
    wait_for(lambda: count >= n, timeout=120)
    dt = time.perf_counter() - t0
    app.stop()
    return n / dt


def main(broker: Broker, n: int = 20_000) -> dict[str, Any]:
    cleanup(broker, QUEUE, f"{QUEUE}.dlq")
    rates: dict[str, list[float]] = {"pika.batched": [], "ackkit.sync.auto": []}
    for _ in range(2):  # interleaved: the machine is noisy, the ratio is what counts
        _fill(broker.url, n)
        rates["pika.batched"].append(_raw_pika(broker.url, n))
        _fill(broker.url, n)
        rates["ackkit.sync.auto"].append(_ackkit(broker, n))
    left = broker.counts(QUEUE)
    best = {k: max(v) for k, v in rates.items()}
    ratio = best["ackkit.sync.auto"] / best["pika.batched"]
    for k, v in best.items():
        print(f"    {k:<18} {v:>9,.0f} msg/s")
    print(
        f"    ratio ackkit/raw  {ratio:>9.2f}   (queue left: ready {left.ready}, "
        f"unacked {left.unacked})"
    )
    cleanup(broker, QUEUE, f"{QUEUE}.dlq")
    return {"rates": best, "ratio": ratio, "left": (left.ready, left.unacked)}


if __name__ == "__main__":
    with broker_for_cli() as b:
        main(b, int(sys.argv[1]) if len(sys.argv) > 1 else 20_000)
