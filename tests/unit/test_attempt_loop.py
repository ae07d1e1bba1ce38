"""The interpreter's attempt loop (`ackkit._interpreter.attempts`), driven by a scripted
driver with no broker and no runtime: what it asks, in which order, and what the core
decides for each answer. Both runtimes run this loop; these tests are the one place its
order is checked."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ackkit._app.handler import Binding, Decoder
from ackkit._core.actions import Ack, Nack, Reject, Republish
from ackkit._core.flow import FlowPolicy, RateLimit
from ackkit._core.inbox import DatabaseDown
from ackkit._core.listener import ListenerCore
from ackkit._core.outcome import Interruption
from ackkit._core.policy import ListenerPolicy
from ackkit._core.retry import Retry, RetryStrategy
from ackkit._core.step import Step
from ackkit._interpreter.attempts import (
    RETURNED,
    Ask,
    Call,
    Called,
    Down,
    Failed,
    Interrupted,
    LookUp,
    Pause,
    Stop,
    attempts,
)
from ackkit._messages.delivery import Delivery
from tests.unit._fakes import V3
from tests.unit._fakes import core as make_core


class _Settler:
    def settle(self, *a: Any) -> None:
        pass


def _binding() -> Binding:
    def handler(body: bytes) -> None:
        pass

    return Binding(handler, Decoder())


def _delivery(c: Any, tag: int, **receive: Any) -> Delivery:
    return Delivery(b"x", None, c.receive(tag, **receive), _Settler(), queue="q")


Answer = Callable[[Any], Any]


def drive(loop: Any, on_call: Callable[[Call], Called], **answers: Answer) -> list[Any]:
    """Run the loop as a driver would; returns what it asked for, in order, with the
    actions carried out (as a Step) after each Ask."""
    seen: list[Any] = []
    answer: Any = None
    while True:
        try:
            req = loop.send(answer)
        except StopIteration:
            return seen
        answer = None
        if type(req) is Ask:
            answer = req.fn(*req.args)
            seen.append(("ask", req.fn.__name__, list(answer.actions)))
        elif type(req) is Call:
            seen.append("call")
            answer = on_call(req)
        else:
            seen.append(req)
            handler = answers.get(type(req).__name__)
            if handler is not None:
                answer = handler(req)


def test_a_handler_that_returns_is_asked_of_the_core_twice_and_acked() -> None:
    c = make_core(prefetch=1)  # a window of one: the ack goes out at once
    d = _delivery(c, 1)
    seen = drive(attempts(c, _binding(), [d]), lambda _r: RETURNED)
    assert seen == [("ask", "begin", []), "call", ("ask", "outcome", [Ack(1)])]


def test_a_failure_is_logged_before_the_core_moves_the_attempt_on() -> None:
    c = make_core(retry=Retry(max_attempts=1))
    d = _delivery(c, 1)
    boom = ValueError("boom")
    seen = drive(attempts(c, _binding(), [d]), lambda _r: Called(exc=boom))
    assert isinstance(seen[2], Failed) and seen[2].exc is boom
    assert seen[3][1] == "outcome"
    assert any(isinstance(a, Republish) for a in seen[3][2])  # dead-lettered (a copy)
    assert d.attempt == 1


def test_an_in_process_retry_pauses_then_asks_to_resume_then_calls_again() -> None:
    retry = Retry(max_attempts=3, initial_interval=0.25, strategy=RetryStrategy.IN_PROCESS)
    c = make_core(retry=retry, prefetch=1)
    d = _delivery(c, 1)
    results = iter([Called(exc=ValueError("once")), RETURNED])
    seen = drive(attempts(c, _binding(), [d]), lambda _r: next(results))
    kinds = [s if isinstance(s, str) else s[1] if isinstance(s, tuple) else type(s) for s in seen]
    assert kinds == ["begin", "call", Failed, "outcome", Pause, "resume", "call", "outcome"]
    pause = next(s for s in seen if isinstance(s, Pause))
    assert pause.seconds == pytest.approx(0.25)
    assert seen[-1][2] == [Ack(1)]


def test_the_rate_limit_pauses_then_asks_to_begin_again_without_booking_twice() -> None:
    c = make_core(flow=FlowPolicy(rate_limit=RateLimit(per_second=1.0, burst=1)))
    c.gating.gated = True
    d1, d2 = _delivery(c, 1), _delivery(c, 2)
    drive(attempts(c, _binding(), [d1]), lambda _r: RETURNED)
    seen = drive(attempts(c, _binding(), [d2]), lambda _r: RETURNED)
    assert seen[0][1] == "begin" and isinstance(seen[1], Pause) and seen[1].seconds > 0
    assert seen[2][1] == "_begin_again" and seen[3] == "call"


def test_an_interruption_during_a_pause_releases_the_deliveries_and_is_raised_again() -> None:
    retry = Retry(max_attempts=3, initial_interval=5.0, strategy=RetryStrategy.IN_PROCESS)
    c = make_core(retry=retry)
    d = _delivery(c, 1)
    loop = attempts(c, _binding(), [d])
    req = loop.send(None)
    assert type(req) is Ask
    req = loop.send(req.fn(*req.args))
    assert type(req) is Call
    req = loop.send(Called(exc=ValueError("x")))
    assert type(req) is Failed
    req = loop.send(None)
    req = loop.send(req.fn(*req.args))  # the outcome: run again after a pause
    assert type(req) is Pause
    req = loop.throw(Interrupted())  # the app's task was cancelled in the pause
    assert type(req) is Ask and req.fn.__name__ == "_release"
    step = req.fn(*req.args)
    assert step.actions == [Nack(1, requeue=True)]  # started: its run counts
    with pytest.raises(Interrupted):
        loop.send(step)


def test_a_cancellation_the_core_releases_ends_the_loop_with_the_delivery_requeued() -> None:
    c = make_core()
    d = _delivery(c, 1)
    loop = attempts(c, _binding(), [d])
    req = loop.send(None)
    req = loop.send(req.fn(*req.args))
    ours = Interruption(ours=True, asked=True, stopping=True)
    req = loop.send(Called(exc=BaseException("cancelled"), interruption=ours))
    assert type(req) is Ask and req.fn.__name__ == "_release"
    assert req.fn(*req.args).actions == [Nack(1, requeue=True)]


def test_a_cancellation_of_the_handlers_own_is_a_failure_like_any_other() -> None:
    c = make_core()
    d = _delivery(c, 1)
    own = Interruption(ours=False, asked=False, stopping=False)
    exc = BaseException("the handler's own")
    seen = drive(attempts(c, _binding(), [d]), lambda _r: Called(exc=exc, interruption=own))
    assert isinstance(seen[2], Failed) and seen[2].exc is exc
    (copy,) = seen[3][2]  # dead-lettered: a copy to the listener's DLQ
    assert isinstance(copy, Republish) and copy.routing_key == "q.dlq"


def test_a_handler_exit_signal_settles_then_asks_the_driver_to_stop_the_app() -> None:
    c = make_core()
    d = _delivery(c, 1)
    exit_ = SystemExit(3)
    seen = drive(attempts(c, _binding(), [d]), lambda _r: Called(exc=exit_))
    assert seen[3][2] == [Reject(1, requeue=True)]  # back to the queue, not a failure
    assert isinstance(seen[-1], Stop) and seen[-1].exc is exit_


def test_a_database_that_is_down_returns_the_deliveries_through_the_inbox() -> None:
    c = make_core()
    d = _delivery(c, 1)
    down = DatabaseDown("gone")
    seen = drive(attempts(c, _binding(), [d], inbox=True), lambda _r: Called(exc=down))
    assert isinstance(seen[-1], Down) and seen[-1].exc is down
    assert not any(isinstance(s, Failed) for s in seen)  # not a failure of the message


@pytest.mark.parametrize("found", ["the-key", None, DatabaseDown("gone")])
def test_an_inbox_redelivery_is_looked_up_first(found: Any) -> None:
    """A redelivery the core would charge as a lost run: its key is looked up before it
    starts. Recorded: acked as a duplicate without a call; not recorded: it runs; the
    database down: returned through the inbox, never run."""
    c = ListenerCore(ListenerPolicy(name="l", queue="q"), broker=V3, dedup=True)
    c.channel_opened()
    d = _delivery(c, 1, redelivered=True, message_id="m")
    assert c.lost.look_up_first(d._tracked)
    seen = drive(
        attempts(c, _binding(), [d], inbox=True),
        lambda _r: RETURNED,
        LookUp=lambda _r: found,
    )
    asked = [type(s) for s in seen if not isinstance(s, tuple | str)]
    assert asked[0] is LookUp
    if found == "the-key":
        assert "call" not in seen and seen[-1][1] == "_duplicate"
        assert c.counters.snapshot()["duplicate"] == 1
    elif found is None:  # not recorded: it goes on to `begin`, which charges the lost run
        begin = next(x for x in seen if isinstance(x, tuple) and x[1] == "begin")
        assert [a.set_headers.get("ackkit-lost") for a in begin[2]] == [1]
    else:
        assert Down in asked and "call" not in seen


@settings(max_examples=60, deadline=None)
@given(
    outcomes=st.lists(st.sampled_from(["ok", "fail", "exit"]), min_size=1, max_size=4),
    max_attempts=st.integers(1, 4),
)
def test_every_unit_ends_settled_once_and_the_loop_ends(
    outcomes: list[str], max_attempts: int
) -> None:
    """Whatever the handler does on each call, the loop ends after at most max_attempts
    calls, and the delivery is settled exactly once (ack, nack, reject or a copy)."""
    retry = Retry(
        max_attempts=max_attempts, initial_interval=0.0, strategy=RetryStrategy.IN_PROCESS
    )
    c = make_core(retry=retry, prefetch=1)
    d = _delivery(c, 1)
    script = iter(outcomes + ["ok"] * 4)

    def call(_r: Call) -> Called:
        what = next(script)
        if what == "ok":
            return RETURNED
        return Called(exc=SystemExit(1) if what == "exit" else ValueError(what))

    seen = drive(attempts(c, _binding(), [d]), call)
    calls = seen.count("call")
    assert 1 <= calls <= max_attempts
    carried = [a for s in seen if isinstance(s, tuple) for a in s[2]]
    settles = [a for a in carried if isinstance(a, Ack | Nack | Reject | Republish)]
    assert len(settles) == 1, carried
    assert d._tracked.settled or any(isinstance(a, Republish) for a in settles)


def test_a_step_reads_as_its_actions_and_carries_its_generation() -> None:
    s = Step(3, [Ack(1)])
    assert s == [Ack(1)] and list(s) == [Ack(1)] and len(s) == 1 and s[0] == Ack(1)
    assert s.generation == 3 and bool(Step(3)) is False
    with pytest.raises(AttributeError):
        s.generation = 4  # type: ignore[misc]
