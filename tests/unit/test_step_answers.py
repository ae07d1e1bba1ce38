"""The core's answer to a handler call carries what the flow gate decided (no broker):
a runtime carries out `Outcome.actions` (a `Consume`, the returns, a `Run` per
delivery the gate lets through) and never asks the gate itself whether to."""

from __future__ import annotations

from typing import Any

import pytest

from ackkit._core.actions import Consume, Nack, Run
from ackkit._core.flow import CircuitBreaker, FlowPolicy, FlowState, SerialKey
from tests.unit._fakes import core as plain_core


def core(**kw: Any) -> Any:
    """A core whose runtime carries out the gate's actions (the App's consumers')."""
    c = plain_core(**kw)
    c.gating.gated = True
    return c


def arrive(c: Any, tag: int, key: str | None = None) -> Any:
    return c.receive(tag, headers={"k": key} if key else None)


def test_without_flow_control_the_answers_carry_no_flow_action() -> None:
    c = core()
    t = c.receive(1)
    assert t.verdict is None
    go = c.begin([t])
    assert go.run == (t,) and go.actions == [] and go.delay == 0
    out = c.handled((t,), None, None)
    assert out.actions == [] and c.drain()


@pytest.mark.parametrize(
    ("exc", "gate"),
    [
        (None, [Run(2)]),  # done: the next of its key starts
        (ValueError("x"), [Consume(False), Nack(2, requeue=True)]),  # tripped: all goes back
    ],
)
def test_a_call_ending_frees_its_key_and_tells_the_breaker(
    exc: BaseException | None, gate: list[Any]
) -> None:
    flow = FlowPolicy(
        breaker=CircuitBreaker(min_attempts=1, failure_ratio=1.0),
        serial_key=SerialKey.header("k"),
    )
    c = core(flow=flow)
    t1 = arrive(c, 1, "a")
    t2 = arrive(c, 2, "a")
    assert (t1.verdict, t2.verdict) == (None, [])  # 2 is held behind 1's key
    assert c.begin([t1]).run == (t1,)
    out = c.handled((t1,), None, exc)
    assert out.actions[-len(gate) :] == gate
    assert c.gating.flow.state is (FlowState.CONSUMING if exc is None else FlowState.TRIPPED)


def test_an_in_process_retry_keeps_its_key() -> None:
    from ackkit import Retry
    from ackkit._core.policy import RetryStrategy

    c = core(
        flow=FlowPolicy(serial_key=SerialKey.header("k")),
        retry=Retry(max_attempts=3, initial_interval=0.1, strategy=RetryStrategy.IN_PROCESS),
    )
    t1 = arrive(c, 1, "a")
    t2 = arrive(c, 2, "a")
    assert t2.verdict == []
    out = c.handled((t1,), None, ValueError("x"))
    assert out.run == (t1,)
    assert not any(type(a) is Run for a in out.actions)  # the key stays taken, 2 waits
    out = c.handled((t1,), None, None)
    assert out.actions == [Run(t2.tag)]


@pytest.mark.parametrize(
    ("ours", "asked", "stopping", "released"),
    [
        (True, None, False, True),  # ackkit cancelled the task (shutdown timeout)
        (False, True, False, True),  # someone asked the task to cancel (3.11+)
        (False, False, False, False),  # the handler's own CancelledError: a failure
        (False, None, False, False),  # 3.10, not stopping: cannot tell, a failure
        (False, None, True, True),  # 3.10, stopping: taken for ours
        (False, False, True, True),  # stopping: released
    ],
)
def test_an_interrupted_handler_is_released_or_a_failure(
    ours: bool, asked: bool | None, stopping: bool, released: bool
) -> None:
    """The asyncio runtime gathers the facts of a cancellation; the core decides."""
    from ackkit._core.outcome import Interruption

    assert core().shutdown.interrupted(Interruption(ours, asked, stopping)) is released
