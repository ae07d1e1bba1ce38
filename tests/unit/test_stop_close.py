"""When a stopping app may close its connection (`stop_budget.may_close`), no I/O.

Closing while a copy awaits its confirm can leave the copy in the queue next to its
original, which the close requeues: the message twice. So a stop closes once nothing
is awaited, at its deadline only when no copy is in flight, and at the latest
`COPY_GRACE` seconds after it.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from ackkit._core.stop_budget import COPY_GRACE, MAX_OVERRUN, may_close

times = st.floats(min_value=0.0, max_value=100.0, allow_nan=False)


@given(in_flight=st.booleans(), now=times, deadline=times)
def test_a_quiescent_stop_closes_at_once(in_flight: bool, now: float, deadline: float) -> None:
    assert may_close(True, in_flight, now, deadline)


@given(in_flight=st.booleans(), now=times, deadline=times)
def test_before_its_deadline_a_stop_waiting_for_something_stays_open(
    in_flight: bool, now: float, deadline: float
) -> None:
    if now <= deadline:
        assert not may_close(False, in_flight, now, deadline)


@given(now=times, deadline=times)
def test_copies_in_flight_keep_it_open_until_the_grace_ends(now: float, deadline: float) -> None:
    assert may_close(False, True, now, deadline) == (now > deadline + COPY_GRACE)


@given(now=times, deadline=times)
def test_without_copies_in_flight_it_closes_past_the_deadline(now: float, deadline: float) -> None:
    assert may_close(False, False, now, deadline) == (now > deadline)


def test_the_grace_is_part_of_the_overrun_the_docs_state() -> None:
    assert COPY_GRACE <= MAX_OVERRUN
    assert round(MAX_OVERRUN, 1) == 5.7  # docs/guide/running.md, docs/reference/configuration.md
