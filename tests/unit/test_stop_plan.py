"""The one order both runtimes stop in (`ackkit._interpreter.stopping`), no I/O.

A stop holds the cores (nothing starts) before it cancels the consumers, cancels
them before anything is returned to the queue (a copy published while the
consumer still consumes could come straight back to it),
returns the unstarted before the handlers finish, lets the handlers finish before
the inbox's database connections close, settles (copies confirmed, acks sent)
before the outbox relay ends its batch, and ends the relay before the connection
closes. Each phase's wait is asked of the one budget when the phase begins.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from ackkit._async.runtime import AsyncRuntime
from ackkit._core.actions import CopyPurpose, Republish
from ackkit._core.listener import ListenerCore
from ackkit._core.policy import ListenerPolicy
from ackkit._core.stop_budget import (
    CANCEL_WAIT,
    CLOSE_GRACE,
    CONFIRM_FLOOR,
    CONFIRM_WAIT,
    RELAY_WAIT,
    StopBudget,
)
from ackkit._interpreter import stopping
from ackkit._interpreter.stopping import Phase, StopStep
from ackkit._sync.runtime import Runtime

P = Phase


def before(order: tuple[Phase, ...], a: Phase, b: Phase) -> bool:
    return order.index(a) < order.index(b)


def test_a_serving_stop_walks_every_phase_in_the_one_order() -> None:
    assert stopping.plan(True) == (
        P.HOLD,
        P.CANCEL,
        P.RETURN_UNSTARTED,
        P.FINISH_HANDLERS,
        P.SETTLE,
        P.END_RELAY,
        P.CLOSE,
        P.RELEASE,
    )


@pytest.mark.parametrize(
    ("first", "then"),
    [
        (P.HOLD, P.CANCEL),  # no handler starts while the broker answers the cancel
        (P.CANCEL, P.RETURN_UNSTARTED),  # or the copies come straight back
        (P.RETURN_UNSTARTED, P.FINISH_HANDLERS),  # not held up behind a slow handler
        (P.FINISH_HANDLERS, P.SETTLE),  # their acks are among those sent
        (P.FINISH_HANDLERS, P.END_RELAY),  # App's inbox closes its connections there
        (P.FINISH_HANDLERS, P.RELEASE),  # AsyncApp's inbox closes its connections there
        (P.SETTLE, P.END_RELAY),  # copies and acks first: a relay's batch waits in the db
        (P.SETTLE, P.CLOSE),  # copies confirmed and acks out before the close
        (P.END_RELAY, P.CLOSE),  # the relay publishes on the connection
        (P.CLOSE, P.RELEASE),
    ],
)
def test_each_phase_comes_after_what_it_needs(first: Phase, then: Phase) -> None:
    for live in (True, False):
        order = stopping.plan(live)
        if first in order and then in order:
            assert before(order, first, then)


def test_without_a_serving_connection_the_channel_phases_are_left_out() -> None:
    channel = {P.CANCEL, P.RETURN_UNSTARTED, P.SETTLE}
    assert stopping.plan(False) == tuple(p for p in stopping.plan(True) if p not in channel)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_each_wait_is_asked_of_the_budget_as_its_phase_begins() -> None:
    clock = Clock()
    budget = StopBudget(12.0, clock=clock)
    taken = {  # seconds each phase spends, as the walk goes on
        P.CANCEL: 0.5,
        P.FINISH_HANDLERS: 9.0,
        P.SETTLE: 2.0,
        P.END_RELAY: 1.0,
    }
    waits: dict[Phase, float] = {}
    for due in stopping.steps(True, budget, 12.0):
        assert due.told == 12.0
        waits[due.phase] = due.wait
        clock.now += taken.get(due.phase, 0.0)
    assert waits[P.CANCEL] == CANCEL_WAIT
    assert waits[P.FINISH_HANDLERS] == 11.5  # what the cancel left
    assert waits[P.SETTLE] == pytest.approx(2.5)
    assert waits[P.END_RELAY] == pytest.approx(0.5)  # what the settle left, no floor
    assert waits[P.CLOSE] == CLOSE_GRACE
    for p in (P.HOLD, P.RETURN_UNSTARTED, P.RELEASE):
        assert waits[p] == 0.0


def test_past_the_deadline_the_confirms_keep_their_floor_and_the_relay_gets_nothing() -> None:
    clock = Clock()
    budget = StopBudget(1.0, clock=clock)
    clock.now += 5.0
    assert stopping.share(P.SETTLE, budget) == CONFIRM_FLOOR
    assert stopping.share(P.END_RELAY, budget) == 0.0
    assert stopping.share(P.FINISH_HANDLERS, budget) == 0.0
    fresh = StopBudget(60.0, clock=clock)
    assert stopping.share(P.SETTLE, fresh) == CONFIRM_WAIT
    assert stopping.share(P.END_RELAY, fresh) == RELAY_WAIT


class Recorder:
    """A `Stopper[None]` that records the phases it is asked to carry out."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, float]] = []

    def _rec(self, name: str) -> Callable[[StopStep], None]:
        return lambda due: self.calls.append((name, due.wait))

    def __getattr__(self, name: str) -> Callable[[StopStep], None]:
        return self._rec(name)


class AsyncRecorder:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Callable[[StopStep], Coroutine[Any, Any, None]]:
        async def carry_out(due: StopStep) -> None:
            await asyncio.sleep(0)
            self.calls.append(name)

        return carry_out


@pytest.mark.parametrize("live", [True, False])
def test_both_walks_call_the_runtime_for_each_phase_in_the_plan_s_order(live: bool) -> None:
    expected = [p.value for p in stopping.plan(live)]
    sync = Recorder()
    stopping.walk(sync, live, StopBudget(3.0), 3.0)  # type: ignore[arg-type]
    assert [name for name, _ in sync.calls] == expected
    aio = AsyncRecorder()
    asyncio.run(stopping.awalk(aio, live, StopBudget(3.0), 3.0))  # type: ignore[arg-type]
    assert aio.calls == expected


@pytest.mark.parametrize("phase", list(Phase))
def test_each_runtime_has_its_means_for_every_phase(phase: Phase) -> None:
    assert callable(getattr(stopping.Stopper, phase.value, None))
    assert callable(getattr(Runtime, phase.value, None))
    assert inspect.iscoroutinefunction(getattr(AsyncRuntime, phase.value, None))


def _core() -> ListenerCore:
    c = ListenerCore(ListenerPolicy(name="l", queue="q"), wallclock=lambda: 0.0)
    c.channel_opened()
    return c


def test_a_holding_core_keeps_what_it_releases_until_it_stops() -> None:
    c = _core()
    t = c.receive(1, False, {}, "", "q")
    c.shutdown.hold()  # the stop begins; the consumer is not cancelled yet
    go = c.begin([t])
    assert not go.run and not go.actions  # not started, and no copy yet
    assert not c.shutdown.quiescent
    acts = c.shutdown.stop()  # the consumer is cancelled: now it goes back
    (copy,) = [a for a in acts if isinstance(a, Republish)]
    assert copy.purpose is CopyPurpose.RESTAMP and copy.tag == 1
    assert c.shutdown.return_next() == []  # sent once


def test_a_holding_core_sends_no_copy_when_another_is_confirmed() -> None:
    c = _core()
    t1 = c.receive(1, False, {}, "", "q")
    t2 = c.receive(2, False, {}, "", "q")
    c.shutdown.stop()
    (copy,) = c.begin([t1]).actions
    assert isinstance(copy, Republish)
    c.shutdown.hold()  # (a second stop begins): nothing goes back until stop()
    assert c.begin([t2]).actions == []
    assert not [a for a in c.republished(copy.token, True) if isinstance(a, Republish)]
    assert [a.tag for a in c.shutdown.stop() if isinstance(a, Republish)] == [2]


def test_a_channel_lost_while_holding_leaves_nothing_to_return() -> None:
    c = _core()
    t = c.receive(1, False, {}, "", "q")
    c.shutdown.hold()
    assert c.begin([t]).actions == []
    c.channel_closed()  # the broker requeued it
    assert not [a for a in c.shutdown.stop() if isinstance(a, Republish)]
    assert c.shutdown.quiescent
