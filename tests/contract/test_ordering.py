"""Ordering on both runtimes: what one consumer keeps, and what a retry strategy changes.

Each test publishes numbered messages and records the order handlers saw them in.
The ordering table of docs/guide/flow-control.md ("What keeps message order") states
these results.
"""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest

from ackkit import Batch, Consumer, Delivery, Retry, RetryStrategy

from .conftest import IO, Broker, Runtime, eventually

pytestmark = pytest.mark.contract


def numbered(n: int) -> list[str | bytes]:
    return [json.dumps({"id": i}) for i in range(n)]


class Order:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.ids: list[int] = []
        self.failed: set[int] = set()

    def saw(self, d: Delivery, fail_once: int | None = None) -> None:
        n = json.loads(d.body)["id"]
        with self.lock:
            self.ids.append(n)
            first = n not in self.failed
            if n == fail_once and first:
                self.failed.add(n)
        if n == fail_once and first:
            raise ConnectionError(f"{n} fails once")


@pytest.mark.parametrize("prefetch", [1, 50])
def test_one_handler_at_a_time_keeps_order_and_an_in_process_retry_keeps_it(
    runtime: Runtime, broker: Broker, queue_factory: Any, prefetch: int
) -> None:
    q = queue_factory(declare=True)
    seen = Order()

    async def handle(d: Delivery, _: Delivery, io: IO) -> None:
        seen.saw(d, fail_once=5)

    app = runtime.app()
    retry = Retry(max_attempts=3, initial_interval=0.1, strategy=RetryStrategy.IN_PROCESS)
    runtime.listen(app, q, handle, consumer=Consumer(prefetch=prefetch), retry=retry)
    broker.publish(q, numbered(30))
    with runtime.running(app):
        eventually(lambda: len(seen.ids) == 31, timeout=30)
        broker.wait_for(q, ready=0, unacked=0)
    assert seen.ids == [*range(6), 5, *range(6, 30)]  # the retry ran before message 6


def test_a_broker_retry_comes_back_behind_later_messages(
    runtime: Runtime, broker: Broker, queue_factory: Any
) -> None:
    q = queue_factory(declare=True)
    seen = Order()

    async def handle(d: Delivery, _: Delivery, io: IO) -> None:
        seen.saw(d, fail_once=5)
        await io.sleep(0.01)

    app = runtime.app()
    retry = Retry(max_attempts=3, initial_interval=0.1, strategy=RetryStrategy.BROKER)
    runtime.listen(app, q, handle, consumer=Consumer(prefetch=50), retry=retry)
    broker.publish(q, numbered(30))
    with runtime.running(app):
        eventually(lambda: len(seen.ids) == 31, timeout=30)
        broker.wait_for(q, ready=0, unacked=0)
    firsts = [n for i, n in enumerate(seen.ids) if n not in seen.ids[:i]]
    assert firsts == list(range(30))
    again = len(seen.ids) - 1 - seen.ids[::-1].index(5)
    assert again > seen.ids.index(6), "the retried message came back ahead of later ones"


def test_batches_hold_consecutive_messages_in_order(
    runtime: Runtime, broker: Broker, queue_factory: Any
) -> None:
    q = queue_factory(declare=True)
    batches: list[list[int]] = []

    async def handle(bodies: list[Any], ds: Any, io: IO) -> None:
        batches.append([b["id"] for b in bodies])

    app = runtime.app()
    runtime.listen(
        app,
        q,
        handle,
        list[dict],
        consumer=Consumer(prefetch=50),
        batch=Batch(5, timeout=0.3),
    )
    broker.publish(q, numbered(40))
    with runtime.running(app):
        eventually(lambda: sum(map(len, batches)) == 40, timeout=30)
        broker.wait_for(q, ready=0, unacked=0)
    assert [n for b in batches for n in b] == list(range(40))
