"""Measure flow control on a real broker, on both runtimes (a script, not a test).

    AMQP_URL=amqp://guest:guest@127.0.0.1:5672/%2f python -m tests.benchmarks.flow_control

1. Circuit breaker: a queue of 2000 messages, a handler whose dependency is down
   (each call takes 5 ms and fails), prefetch 100, 4 handlers at once; the breaker
   trips at a failure ratio of 0.5 over 10 s once 20 calls ended. Reported: the calls
   made against the failing dependency, how long after the trip the last handler
   started, and how long until the broker showed no consumer (a passive
   queue.declare, polled every 5 ms), and how many messages it left unattempted.
2. Rate limit: 400 messages at RateLimit(100) and 150 at RateLimit(25), 4 handlers at
   once: the achieved rate of handler starts against the limit.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
import uuid
from typing import Any

import pika

from ackkit import App, AsyncApp, Consumer, Delivery, Flow
from ackkit.flow import CircuitBreaker, RateLimit
from ackkit.observability import Stage

URL = os.environ.get("AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2f")


def publish(q: str, n: int) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(URL))
    ch = conn.channel()
    ch.queue_declare(q, durable=True)
    ch.confirm_delivery()
    props = pika.BasicProperties(delivery_mode=2)
    for i in range(n):
        ch.basic_publish("", q, json.dumps({"id": i}).encode(), props)
    conn.close()


def cleanup(q: str) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(URL))
    ch = conn.channel()
    for name in (q, f"{q}.dlq"):
        ch.queue_delete(name)
    conn.close()


class Run:
    """Runs an App or an AsyncApp in the background."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.app: Any = App(URL, shutdown_timeout=5) if kind == "sync" else AsyncApp(URL)
        self.loop: asyncio.AbstractEventLoop | None = None

    def handler(self, body: Any) -> Any:
        if self.kind == "sync":

            def handle(d: Delivery) -> None:
                body(d)
                time.sleep(0.005)

            return handle

        async def ahandle(d: Delivery) -> None:
            body(d)
            await asyncio.sleep(0.005)

        return ahandle

    def start(self) -> None:
        if self.kind == "sync":
            self.app.start()
            return
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        asyncio.run_coroutine_threadsafe(self.app.start(), self.loop).result(60)

    def stop(self) -> None:
        if self.kind == "sync":
            self.app.stop()
            return
        assert self.loop is not None
        asyncio.run_coroutine_threadsafe(self.app.stop(), self.loop).result(60)
        self.loop.call_soon_threadsafe(self.loop.stop)


def breaker(kind: str) -> dict[str, Any]:
    q = f"bench.flow.breaker.{uuid.uuid4().hex[:6]}"
    publish(q, 2000)
    run = Run(kind)
    calls: list[float] = []
    trips: list[float] = []

    def body(d: Delivery) -> None:
        calls.append(time.monotonic())
        raise ConnectionError("dependency down")

    def watch(e: Any) -> None:
        if e.stage is Stage.TRIPPED and not trips:
            trips.append(time.monotonic())

    run.app.on_event(watch)
    cb = CircuitBreaker(failure_ratio=0.5, window=10, min_attempts=20, open_for=30)
    run.app.listener(
        q,
        consumer=Consumer(prefetch=100, concurrency=4),
        flow=Flow(circuit_breaker=cb),
        dead_letter="{queue}.dlq",
    )(run.handler(body))
    conn = pika.BlockingConnection(pika.URLParameters(URL))
    ch = conn.channel()
    run.start()
    try:
        while not trips:
            time.sleep(0.001)
        while ch.queue_declare(q, passive=True).method.consumer_count:
            time.sleep(0.005)
        gone = time.monotonic()
        time.sleep(2.0)  # nothing more may start
        ready = ch.queue_declare(q, passive=True).method.message_count
    finally:
        run.stop()
        conn.close()
        cleanup(q)
    t = trips[0]
    return {
        "runtime": kind,
        "calls against the failing dependency": len(calls),
        "calls after the trip": sum(1 for c in calls if c > t),
        "last handler start after the trip (ms)": round(max(0.0, max(calls) - t) * 1000, 1),
        "no consumer at the broker after (ms)": round((gone - t) * 1000, 1),
        "left in the queue, unattempted": ready,
    }


def rate(kind: str, limit: float, n: int) -> dict[str, Any]:
    q = f"bench.flow.rate.{uuid.uuid4().hex[:6]}"
    publish(q, n)
    run = Run(kind)
    starts: list[float] = []
    run.app.listener(
        q,
        consumer=Consumer(prefetch=100, concurrency=4),
        flow=Flow(rate_limit=RateLimit(limit)),
    )(run.handler(lambda d: starts.append(time.monotonic())))
    run.start()
    try:
        while len(starts) < n:
            time.sleep(0.01)
    finally:
        run.stop()
        cleanup(q)
    achieved = (n - 1) / (starts[-1] - starts[0])
    return {
        "runtime": kind,
        "limit (msg/s)": limit,
        "messages": n,
        "achieved (msg/s)": round(achieved, 2),
        "ratio": round(achieved / limit, 4),
    }


def main() -> None:
    for kind in ("sync", "async"):
        print(json.dumps(breaker(kind)))
    for kind in ("sync", "async"):
        for limit, n in ((100.0, 400), (25.0, 150)):
            print(json.dumps(rate(kind, limit, n)))


if __name__ == "__main__":
    main()
