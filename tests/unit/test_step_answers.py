"""The core's answer to a handler call carries what the flow gate decided (no broker):
a runtime carries out `Outcome.flow` and never asks the gate itself whether to."""

from __future__ import annotations

from typing import Any

import pytest

from ackkit._core.flow import CircuitBreaker, FlowPolicy, FlowState, SerialKey
from ackkit._core.gate import Admission
from tests.unit._fakes import core


def arrive(c: Any, tag: int, key: str | None = None) -> Any:
    t = c.receive(tag, headers={"k": key} if key else None)
    assert t.verdict is None
    return t, c.flow.arrive(t, key)


def test_without_flow_control_the_answer_carries_no_flow_step() -> None:
    c = core()
    t = c.receive(1)
    assert c.start(t) is None
    out = c.handled((t,), None, None)
    assert out.flow is None and out.actions == [] and c.drain()


@pytest.mark.parametrize(
    ("exc", "ready", "consume"),
    [
        (None, [2], None),  # done: the next of its key starts
        (ValueError("x"), [], False),  # a failure trips the breaker: all goes back
    ],
)
def test_a_call_ending_frees_its_key_and_tells_the_breaker(
    exc: BaseException | None, ready: list[int], consume: bool | None
) -> None:
    flow = FlowPolicy(
        breaker=CircuitBreaker(min_attempts=1, failure_ratio=1.0),
        serial_key=SerialKey.header("k"),
    )
    c = core(flow=flow)
    t1, how1 = arrive(c, 1, "a")
    _t2, how2 = arrive(c, 2, "a")
    assert (how1, how2) == (Admission.RUN, Admission.WAIT)
    assert c.start(t1) is None
    out = c.handled((t1,), None, exc)
    assert out.flow is not None
    assert [t.tag for t in out.flow.ready] == ready
    assert out.flow.consume is consume
    if consume is False:
        assert [t.tag for t in out.flow.returned] == [2]
        assert c.flow.state is FlowState.TRIPPED


def test_an_in_process_retry_keeps_its_key() -> None:
    from ackkit import Retry
    from ackkit._core.policy import RetryStrategy

    c = core(
        flow=FlowPolicy(serial_key=SerialKey.header("k")),
        retry=Retry(max_attempts=3, initial_interval=0.1, strategy=RetryStrategy.IN_PROCESS),
    )
    t1, _ = arrive(c, 1, "a")
    t2, how2 = arrive(c, 2, "a")
    assert how2 is Admission.WAIT
    out = c.handled((t1,), None, ValueError("x"))
    assert out.rerun == (t1,)
    assert out.flow is None  # nothing to do: the key stays taken, 2 still waits
    out = c.handled((t1,), None, None)
    assert out.flow is not None and out.flow.ready == [t2]


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

    assert core().interrupted(Interruption(ours, asked, stopping)) is released
