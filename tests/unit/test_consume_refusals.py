"""What a refused consumer comes to (`ackkit._core.consume`), and how long a stop may
wait (`ackkit._core.stop_budget`), without a broker."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from ackkit._core.consume import (
    MAX_REDECLARES,
    STANDBY_POLL,
    ConsumeMove,
    Consuming,
    check_channels,
)
from ackkit._core.flow import NO_FLOW
from ackkit._core.gate import Flow
from ackkit._core.stop_budget import MAX_OVERRUN, StopBudget
from ackkit.errors import ConsumeRefused
from ackkit.flow import FlowState

EXCLUSIVE = "ACCESS_REFUSED - queue 'q' in vhost '/' in exclusive use"
NO_READ = "ACCESS_REFUSED - access to queue 'q' in vhost '/' refused for user 'u'"
GONE = "NOT_FOUND - no queue 'q' in vhost '/'"
LOCKED = "RESOURCE_LOCKED - cannot obtain exclusive access to locked queue 'q' in vhost '/'"


def consuming(*, declare: bool = True, exclusive: bool = False) -> Consuming:
    flow = Flow(NO_FLOW, lambda: 0.0, lambda stage, why: None)
    return Consuming(flow, "q:h", "q", declare=declare, exclusive=exclusive)


def test_an_exclusive_conflict_is_a_standby_logged_once_and_ended_by_consume_ok() -> None:
    c = consuming()
    first = c.refused(403, EXCLUSIVE)
    assert first.move is ConsumeMove.STANDBY and first.delay == STANDBY_POLL
    assert first.log is not None and "standing by" in first.log and EXCLUSIVE in first.log
    assert c.flow.state is FlowState.STANDBY and c.flow.consuming
    for _ in range(50):  # every later try is quiet
        again = c.refused(403, EXCLUSIVE)
        assert again.move is ConsumeMove.STANDBY and again.log is None
    line = c.consumed()
    assert line is not None and "took over" in line
    assert c.flow.state is FlowState.CONSUMING
    assert c.consumed() is None  # an ordinary consume-ok logs nothing


def test_a_permission_refusal_fails_with_the_brokers_text() -> None:
    for code, text in ((403, NO_READ), (405, LOCKED), (406, "PRECONDITION_FAILED - x")):
        step = consuming().refused(code, text)
        assert step.move is ConsumeMove.FAIL
        assert isinstance(step.error, ConsumeRefused) and text in str(step.error)


def test_a_deleted_queue_is_declared_again_or_fails_with_declare_false() -> None:
    c = consuming()
    step = c.refused(404, GONE)
    assert step.move is ConsumeMove.DECLARE and step.log is not None
    assert c.consumed() is not None  # "declared again; consuming"
    assert c.refused(404, GONE).log is not None  # a new deletion: a new line
    off = consuming(declare=False).refused(404, GONE)
    assert off.move is ConsumeMove.FAIL and off.error is not None
    assert "declare=False" in str(off.error) and GONE in str(off.error)


def test_a_queue_deleted_again_and_again_stops_instead_of_looping() -> None:
    c = consuming()
    moves = [c.refused(404, GONE).move for _ in range(MAX_REDECLARES + 1)]
    assert moves == [ConsumeMove.DECLARE] * MAX_REDECLARES + [ConsumeMove.FAIL]
    assert sum(1 for _ in moves) == MAX_REDECLARES + 1


def test_other_closes_are_the_usual_retry() -> None:
    for code in (None, 0, 320, 504, 541):
        step = consuming().refused(code, "whatever")
        assert step.move is ConsumeMove.RETRY and step.delay > 0


REFUSALS = st.sampled_from(
    [(403, EXCLUSIVE), (403, NO_READ), (404, GONE), (405, LOCKED), (None, ""), (320, "x"), None]
)


@settings(max_examples=200, deadline=None)
@given(st.lists(REFUSALS, max_size=40), st.booleans(), st.booleans())
def test_any_sequence_logs_at_most_one_line_per_episode_and_never_loops(
    events: list[tuple[int | None, str] | None], declare: bool, exclusive: bool
) -> None:
    """Over any sequence of refusals and consume-oks (None): a standby logs one line when
    it starts and one when it ends; a FAIL carries the broker's text; a deleted queue is
    declared again at most MAX_REDECLARES times in a row; the state is STANDBY exactly
    while the last refusal that said anything about the queue was an exclusive conflict."""
    c = consuming(declare=declare, exclusive=exclusive)
    in_standby = False
    declares_in_row = 0
    for ev in events:
        if ev is None:
            line = c.consumed()
            assert (line is not None) == (in_standby or declares_in_row > 0)
            in_standby, declares_in_row = False, 0
            continue
        code, text = ev
        step = c.refused(code, text)
        if step.move is ConsumeMove.FAIL:
            assert step.error is not None
            assert text in str(step.error)
            return  # the app stops
        if step.move is ConsumeMove.STANDBY:
            assert (step.log is not None) == (not in_standby)
            in_standby = True
        elif step.move is not ConsumeMove.RETRY:  # a close of another kind: still waiting
            in_standby = False
        if step.move is ConsumeMove.DECLARE:
            assert declare
            declares_in_row += 1
            assert declares_in_row <= MAX_REDECLARES
        assert (c.flow.state is FlowState.STANDBY) == in_standby


@given(st.integers(0, 70_000), st.integers(0, 70_000))
def test_channel_check_names_the_numbers(listeners: int, channel_max: int) -> None:
    why = check_channels(listeners, channel_max, "amqp://h/")
    limit = channel_max or 65535
    need = 2 * listeners + 1  # a consumer and a copies channel each, one publisher
    assert (why is None) == (need <= limit)
    if why is not None:
        assert f"needs {need} channels" in why and f"channel_max={limit}" in why


@settings(max_examples=200, deadline=None)
@given(
    st.floats(0, 120),
    st.lists(st.floats(0, 60), min_size=4, max_size=4),
)
def test_a_stops_waits_add_up_to_at_most_the_timeout_plus_the_overrun(
    timeout: float, spent: list[float]
) -> None:
    """Whatever each step really takes (up to what it was given), the waits of one stop
    sum to at most shutdown_timeout + MAX_OVERRUN; handlers get the whole timeout when
    the cancel is answered at once."""
    now = [0.0]
    budget = StopBudget(timeout, clock=lambda: now[0])
    assert budget.handlers() == timeout
    steps = (budget.cancel, budget.handlers, budget.confirms, budget.relay)
    for step, took in zip(steps, spent, strict=True):
        given_ = step()
        assert given_ >= 0
        now[0] += min(took, given_)
    now[0] += budget.close
    assert now[0] <= timeout + MAX_OVERRUN + 1e-9


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 40), st.sets(st.integers(1, 40), max_size=39), st.integers(1, 200))
def test_channel_numbers_stay_within_channel_max_and_skip_open_channels(
    limit: int, in_use: set[int], takes: int
) -> None:
    """AsyncApp's channel numbers: a standby opens a channel every few seconds for as long
    as it waits, so the numbers wrap at the connection's channel_max instead of running
    past it, never hand out an open channel's number, and do not come back to a number
    before every other free one was used."""
    from ackkit._async._amqp import ChannelNumbers

    free = [n for n in range(1, limit + 1) if n not in in_use]
    if not free:
        return
    numbers = ChannelNumbers(limit, in_use)
    got = [numbers.take() for _ in range(takes)]
    assert all(1 <= n <= limit and n not in in_use for n in got)
    for i in range(len(got) - len(free) + 1):
        window = got[i : i + len(free)]
        assert len(set(window)) == len(window)
