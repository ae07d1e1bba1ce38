"""The arrival rule as a table: what a delivery comes to before any handler sees it."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ackkit._core.arrival import Arrival, arrival
from ackkit._core.brokers import CountSource
from ackkit._core.policy import AckMode

A, N = AckMode.AUTO, AckMode.NONE
RD = CountSource.REDELIVERED
COUNTED = [c for c in CountSource if c is not RD]


@pytest.mark.parametrize(
    "mode,unreadable,forged,attempt,mx,redelivered,count,want",
    [
        (A, False, False, 1, 1, False, RD, Arrival.RUN),
        (A, True, False, 1, 1, False, RD, Arrival.UNREADABLE),
        (A, True, True, 9, 3, True, RD, Arrival.UNREADABLE),  # unreadable first
        (N, True, False, 1, 1, False, RD, Arrival.UNREADABLE),
        (N, False, True, 9, 3, True, RD, Arrival.RUN),  # no-ack: the handler is its chance
        (A, False, True, 1, 1, False, RD, Arrival.FORGED),
        (A, False, True, 5, 3, True, RD, Arrival.FORGED),
        (A, False, False, 4, 3, True, RD, Arrival.EXHAUSTED),
        (A, False, False, 3, 3, True, RD, Arrival.RESTAMP),
        (A, False, False, 3, 3, False, RD, Arrival.RUN),
        (A, False, False, 9, 1, True, RD, Arrival.RUN),  # no retries: nothing counted
        *[(A, False, False, 2, 3, True, c, Arrival.RUN) for c in COUNTED],
        *[(A, False, False, 4, 3, True, c, Arrival.EXHAUSTED) for c in COUNTED],
    ],
)
def test_arrival_table(
    mode: AckMode,
    unreadable: bool,
    forged: bool,
    attempt: int,
    mx: int,
    redelivered: bool,
    count: CountSource,
    want: Arrival,
) -> None:
    got = arrival(
        mode=mode,
        unreadable=unreadable,
        forged=forged,
        attempt=attempt,
        max_attempts=mx,
        redelivered=redelivered,
        count=count,
    )
    assert got is want


@given(
    st.sampled_from(list(AckMode)),
    st.booleans(),
    st.booleans(),
    st.integers(1, 100),
    st.integers(1, 100),
    st.booleans(),
    st.sampled_from(list(CountSource)),
)
def test_only_a_readable_fresh_delivery_within_its_attempts_runs(
    mode: AckMode,
    unreadable: bool,
    forged: bool,
    attempt: int,
    mx: int,
    redelivered: bool,
    count: CountSource,
) -> None:
    got = arrival(
        mode=mode,
        unreadable=unreadable,
        forged=forged,
        attempt=attempt,
        max_attempts=mx,
        redelivered=redelivered,
        count=count,
    )
    if unreadable:
        assert got is Arrival.UNREADABLE
    elif mode is AckMode.NONE:
        assert got is Arrival.RUN
    elif got is Arrival.RUN:
        assert not forged and (mx <= 1 or attempt <= mx)
        assert mx <= 1 or not redelivered or count is not RD
