"""Handlers that misbehave: whatever a handler raises or returns, its delivery is settled.

On both runtimes against the broker: exceptions outside the Exception tree,
exceptions whose str() raises, RetryLater with delays that are not numbers,
interpreter-exit signals (settled first, then the app stops visibly), and
generated mixes of all of these. The broker is asked what became of every
message; a handler's run count is the test's own record.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import threading
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ackkit import (
    AckMode,
    Consumer,
    DeadLetterMessage,
    Delivery,
    RejectMessage,
    RequeueMessage,
    Retry,
    RetryLater,
    RetryStrategy,
)
from tests.contract.conftest import IO, Broker, Runtime, eventually

pytestmark = pytest.mark.integration


class Odd(BaseException):
    """Not an Exception, not an exit signal."""


class Hostile(Exception):
    def __str__(self) -> str:
        raise RuntimeError("str() of this exception fails")


class HostileBase(Exception):
    def __str__(self) -> str:
        raise Odd("str() of this exception raises a BaseException")


class Runs:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.by_id: dict[int, int] = {}

    def add(self, i: int) -> int:
        with self.lock:
            self.by_id[i] = self.by_id.get(i, 0) + 1
            return self.by_id[i]

    def total(self) -> int:
        with self.lock:
            return sum(self.by_id.values())


def ids(n: int) -> list[str | bytes]:
    return [json.dumps({"id": i}) for i in range(n)]


@pytest.mark.parametrize(
    ("raised", "type_name", "runs_each"),
    [
        # Not an Exception: the default retry_on does not retry it.
        (Odd("not an Exception"), "Odd", 1),
        (GeneratorExit(), "GeneratorExit", 1),
        (Hostile(), "Hostile", 3),  # an Exception whose str() raises: retried as usual
        (HostileBase(), "HostileBase", 3),  # ... and one whose str() raises a BaseException
        # raised by the handler itself, not a cancelled task: AsyncApp released it to the
        # queue as if shutting down (redelivered forever with max_attempts=1)
        (asyncio.CancelledError("raised by the handler"), "CancelledError", 1),
    ],
)
def test_any_exception_is_dead_lettered_and_the_listener_goes_on(
    runtime: Runtime,
    broker: Broker,
    queue_factory: Any,
    raised: BaseException,
    type_name: str,
    runs_each: int,
) -> None:
    q = queue_factory(declare=True)
    runs = Runs()

    async def handle(p: dict[str, int], d: Delivery, io: IO) -> None:
        runs.add(p["id"])
        if p["id"] % 2 == 0:
            raise raised

    app = runtime.app()
    runtime.listen(app, q, handle, dict, retry=Retry(max_attempts=3, initial_interval=0.05))
    broker.publish(q, ids(6))
    with runtime.running(app):
        broker.wait_for(f"{q}.dlq", ready=3)
        broker.wait_for(q, ready=0, unacked=0)
        assert app.is_running
        broker.publish(q, [json.dumps({"id": 101})])  # still consuming
        eventually(lambda: runs.by_id.get(101) == 1, what="a later message handled")
        broker.wait_for(q, ready=0, unacked=0)
    dead = broker.take_all(f"{q}.dlq")
    assert sorted(json.loads(m.body)["id"] for m in dead) == [0, 2, 4]
    for m in dead:
        assert m.headers["ackkit-error-type"].endswith(type_name)
        assert m.headers["ackkit-reason"]
    assert {i: n for i, n in runs.by_id.items() if i % 2 == 0 and i < 100} == {
        0: runs_each,
        2: runs_each,
        4: runs_each,
    }


def test_a_cancelled_error_from_the_handler_is_dead_lettered_without_retry(
    runtime: Runtime, broker: Broker, queue_factory: Any
) -> None:
    """With the default Retry (one attempt), AsyncApp used to requeue a delivery whose
    handler raised CancelledError (taken for its task's cancellation): the broker handed
    it back at once, about a thousand runs a second, for ever."""
    q = queue_factory(declare=True)
    runs = Runs()

    async def handle(p: dict[str, int], d: Delivery, io: IO) -> None:
        runs.add(p["id"])
        if p["id"] == 0:
            raise asyncio.CancelledError("an inner task was cancelled")

    app = runtime.app()
    runtime.listen(app, q, handle, dict)
    broker.publish(q, ids(2))
    with runtime.running(app):
        broker.wait_for(f"{q}.dlq", ready=1)
        broker.wait_for(q, ready=0, unacked=0)
        broker.publish(q, [json.dumps({"id": 7})])
        eventually(lambda: runs.by_id.get(7) == 1, what="a later message handled")
        assert app.is_running
    (dead,) = broker.take_all(f"{q}.dlq")
    assert json.loads(dead.body) == {"id": 0}
    assert dead.headers["ackkit-reason"] == "non-retryable asyncio.exceptions.CancelledError"
    assert dead.headers["ackkit-error-type"] == "asyncio.exceptions.CancelledError"
    assert runs.by_id == {0: 1, 1: 1, 7: 1}


@pytest.mark.parametrize("delay", [math.nan, -3.0, "soon"])
def test_retry_later_with_a_delay_that_is_no_number_uses_the_policy(
    runtime: Runtime, broker: Broker, queue_factory: Any, delay: Any
) -> None:
    q = queue_factory(declare=True)
    runs = Runs()

    async def handle(p: dict[str, int], d: Delivery, io: IO) -> None:
        if runs.add(p["id"]) == 1:
            exc = RetryLater("later")
            exc.delay = delay
            raise exc

    app = runtime.app()
    runtime.listen(app, q, handle, dict, retry=Retry(max_attempts=2, initial_interval=0.05))
    broker.publish(q, ids(3))
    with runtime.running(app):
        eventually(lambda: runs.total() == 6, what="two runs each")
        broker.wait_for(q, ready=0, unacked=0)
        assert app.is_running
    assert broker.counts(f"{q}.dlq").total == 0


def test_retry_later_forever_waits_a_capped_day_in_a_delay_queue(
    runtime: Runtime, broker: Broker, queue_factory: Any
) -> None:
    """delay=inf used to raise OverflowError in the core and stop the listener silently."""
    q = queue_factory(declare=True)
    runs = Runs()

    async def handle(p: dict[str, int], d: Delivery, io: IO) -> None:
        runs.add(p["id"])
        raise RetryLater("much later", delay=math.inf)

    app = runtime.app()
    runtime.listen(app, q, handle, dict, retry=Retry(max_attempts=2, initial_interval=0.05))
    broker.publish(q, ids(2))
    with runtime.running(app):
        broker.wait_for(f"{q}.retry.86400000ms", ready=2)  # deleted with the test's queues
        broker.wait_for(q, ready=0, unacked=0)
        assert app.is_running
    assert runs.by_id == {0: 1, 1: 1}


def run_until(runtime: Runtime, app: Any, done: Callable[[], bool]) -> BaseException | None:
    """Run `app` with its own `running()` context (not the harness's start/stop), until
    `done()`. Returns what running() raised (start or exit), None if nothing."""
    if not runtime.is_async:
        try:
            with app.running():
                eventually(done, what="the app stops itself")
        except BaseException as exc:
            return exc
        return None

    async def go() -> BaseException | None:
        # Caught inside the loop: SystemExit / KeyboardInterrupt escaping a task end the
        # event loop itself (asyncio's rule), and this one is the test's loop thread.
        try:
            async with app.running():
                while not await asyncio.to_thread(done):
                    await asyncio.sleep(0.05)
        except BaseException as exc:
            return exc
        return None

    caught: BaseException | None = runtime.lt.run(go())  # type: ignore[attr-defined]
    return caught


@pytest.mark.parametrize("signal", [SystemExit, KeyboardInterrupt])
def test_exit_signal_requeues_its_delivery_then_stops_the_app_visibly(
    runtime: Runtime,
    broker: Broker,
    queue_factory: Any,
    signal: type[BaseException],
    caplog: pytest.LogCaptureFixture,
) -> None:
    q = queue_factory(declare=True)
    runs = Runs()

    async def handle(p: dict[str, int], d: Delivery, io: IO) -> None:
        runs.add(p["id"])
        raise signal()

    def app() -> Any:
        a = runtime.app()
        runtime.listen(a, q, handle, dict, retry=Retry(max_attempts=3, initial_interval=0.05))
        return a

    broker.publish(q, ids(1))
    caplog.set_level(logging.ERROR, "ackkit")
    first = app()
    assert isinstance(run_until(runtime, first, lambda: not first.is_running), signal)
    assert not first.is_running
    assert any(signal.__name__ in r.getMessage() for r in caplog.records)
    c = broker.wait_for(q, ready=1, unacked=0)  # back in the queue, not lost
    assert c.consumers == 0
    # A handler that exits every time still reaches max attempts and the DLQ.
    for _ in range(3):
        again = app()
        caught = run_until(
            runtime,
            again,
            lambda a=again: not a.is_running or broker.counts(f"{q}.dlq").ready == 1,
        )
        if caught is None:
            break
        assert isinstance(caught, signal)
    broker.wait_for(f"{q}.dlq", ready=1)
    broker.wait_for(q, ready=0, unacked=0)
    [dead] = broker.take_all(f"{q}.dlq")
    assert "attempts exhausted" in dead.headers["ackkit-reason"]
    # A redelivery counts as an attempt, whether it ran or was returned unstarted while
    # the app stopped (a classic queue cannot tell the two apart).
    assert 2 <= runs.by_id[0] <= 3


BEHAVIOURS = st.sampled_from(
    ["ok", "raise", "odd", "hostile", "requeue", "reject", "dead", "later", "later-nan"]
)


@settings(
    max_examples=4,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(plan=st.lists(BEHAVIOURS, min_size=4, max_size=10), in_process=st.booleans())
def test_generated_handler_outcomes_end_acked_or_dead_lettered(
    runtime: Runtime, broker: Broker, queue_factory: Any, plan: list[str], in_process: bool
) -> None:
    """Each message's handler does one thing on every attempt; with max_attempts 3 each
    ends acked or in the DLQ, after a bounded number of runs, and nothing stays queued.
    A requeue counts as an attempt only through redelivery, so it is bounded the same."""
    q = queue_factory(declare=True)
    runs = Runs()
    strategy = RetryStrategy.IN_PROCESS if in_process else RetryStrategy.BROKER

    async def handle(p: dict[str, int], d: Delivery, io: IO) -> None:
        i = p["id"]
        runs.add(i)
        what = plan[i]
        if what == "ok":
            return
        if what == "raise":
            raise ValueError(f"fails {i}")
        if what == "odd":
            raise Odd(i)
        if what == "hostile":
            raise Hostile()
        if what == "requeue":
            raise RequeueMessage()
        if what == "reject":
            raise RejectMessage()
        if what == "dead":
            raise DeadLetterMessage()
        exc = RetryLater("later", delay=0.02)
        if what == "later-nan":
            exc.delay = math.nan
        raise exc

    app = runtime.app()
    retry = Retry(max_attempts=3, initial_interval=0.02, strategy=strategy)
    runtime.listen(
        app,
        q,
        handle,
        dict,
        retry=retry,
        ack_mode=AckMode.AUTO,
        consumer=Consumer(prefetch=20),
    )
    broker.publish(q, ids(len(plan)))
    want_dead = sum(1 for w in plan if w != "ok")
    with runtime.running(app):
        broker.wait_for(f"{q}.dlq", ready=want_dead, timeout=30)
        broker.wait_for(q, ready=0, unacked=0)
        assert app.is_running
    dead = broker.take_all(f"{q}.dlq")
    assert sorted(json.loads(m.body)["id"] for m in dead) == [
        i for i, w in enumerate(plan) if w != "ok"
    ]
    for i, what in enumerate(plan):
        assert 1 <= runs.by_id[i] <= 3, (what, runs.by_id[i])
