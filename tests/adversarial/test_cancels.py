"""AsyncApp as on Python 3.10 (Task.cancelling() hidden), against the broker.

On 3.10 every CancelledError was taken for a shutdown: a handler raising one itself
had its delivery requeued, about a thousand runs a second, for ever. ackkit now
records the cancellations it makes itself (`ackkit._async.cancels`)."""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

import pytest

from ackkit import AsyncApp, Delivery
from ackkit._async import cancels
from tests.contract.conftest import Broker, LoopThread, eventually

pytestmark = pytest.mark.integration


@pytest.fixture(autouse=True)
def python_310(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cancels, "_task_cancelling", None)


def test_a_handlers_own_cancelled_error_is_dead_lettered_once(
    broker: Broker, queue_factory: Any, loop_thread: LoopThread
) -> None:
    q = queue_factory(declare=True)
    runs: dict[int, int] = {}
    lock = threading.Lock()
    app = AsyncApp(broker.handle.url)

    @app.listener(q)
    async def handle(p: dict[str, int], d: Delivery) -> None:
        with lock:
            runs[p["id"]] = runs.get(p["id"], 0) + 1
        if p["id"] == 0:
            raise asyncio.CancelledError("an inner task was cancelled")

    broker.publish(q, [json.dumps({"id": i}) for i in range(2)])
    loop_thread.run(app.start())
    try:
        broker.wait_for(f"{q}.dlq", ready=1)
        broker.wait_for(q, ready=0, unacked=0)
        eventually(lambda: runs.get(1) == 1, what="the other message handled")
    finally:
        loop_thread.run(app.stop())
    (dead,) = broker.take_all(f"{q}.dlq")
    assert json.loads(dead.body) == {"id": 0}
    assert dead.headers["ackkit-reason"] == "non-retryable asyncio.exceptions.CancelledError"
    assert dead.headers["ackkit-error-type"] == "asyncio.exceptions.CancelledError"
    assert runs == {0: 1, 1: 1}


def test_a_handler_cancelled_at_the_shutdown_timeout_is_requeued(
    broker: Broker, queue_factory: Any, loop_thread: LoopThread
) -> None:
    q = queue_factory(declare=True)
    started = threading.Event()
    app = AsyncApp(broker.handle.url, shutdown_timeout=0.5)

    @app.listener(q)
    async def handle(p: dict[str, int], d: Delivery) -> None:
        started.set()
        await asyncio.sleep(60)

    broker.publish(q, [json.dumps({"id": 0})])
    loop_thread.run(app.start())
    try:
        assert started.wait(10)
    finally:
        loop_thread.run(app.stop())  # cancels the handler: ackkit's own cancellation
    broker.wait_for(q, ready=1, unacked=0)
    assert broker.counts(f"{q}.dlq").total == 0
