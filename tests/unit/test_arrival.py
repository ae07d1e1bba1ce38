"""The arrival rule as a table: what a delivery comes to before any handler sees it."""

from __future__ import annotations

import pytest
from hypothesis import assume, given, settings
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


# -- receive() skips the rule where it surely says RUN: it must agree -------------------


@settings(max_examples=300)
@given(
    mode=st.sampled_from([AckMode.AUTO, AckMode.MANUAL, AckMode.NONE, AckMode.TRANSACTED]),
    max_attempts=st.integers(1, 5),
    redelivered=st.booleans(),
    attempt_header=st.none()
    | st.integers(-2, 2).map(lambda off: ("offset", off))
    | st.sampled_from(["2", "x", "²", -1, 0]),
    queue_type=st.sampled_from([None, "classic", "quorum"]),
    delivery_count=st.none() | st.integers(0, 8),
)
def test_receive_runs_a_delivery_exactly_when_the_arrival_rule_says_run(
    mode: AckMode,
    max_attempts: int,
    redelivered: bool,
    attempt_header: object,
    queue_type: str | None,
    delivery_count: int | None,
) -> None:
    """`ListenerCore.receive` returns early for a first delivery with attempts left (a
    hot-path shortcut); with any headers and flags, a delivery runs (no verdict) exactly
    when `arrival()`, given the same facts, says RUN."""
    from ackkit import Retry
    from ackkit._core import headers as H
    from ackkit._core.brokers import V3
    from ackkit._core.listener import ListenerCore
    from ackkit._core.policy import ListenerPolicy

    retry = Retry(max_attempts=max_attempts, initial_interval=0.1) if max_attempts > 1 else None
    kw = {"retry": retry} if retry is not None else {}
    try:
        policy = ListenerPolicy(name="l", queue="q", mode=mode, queue_type=queue_type, **kw)
    except ValueError:  # a combination the options refuse (e.g. retries with no acks)
        assume(False)
        return
    core = ListenerCore(policy, wallclock=lambda: 0.0, broker=V3)
    core.channel_opened()
    headers: dict[str, object] = {}
    if isinstance(attempt_header, tuple):  # around max_attempts, where the rule turns
        headers[H.ATTEMPT] = max(1, max_attempts + attempt_header[1])
    elif attempt_header is not None:
        headers[H.ATTEMPT] = attempt_header
    if delivery_count is not None:
        headers[H.X_DELIVERY_COUNT] = delivery_count
    t = core.receive(1, redelivered, headers or None, message_id="m")
    count = V3.count_source(queue_type)
    try:
        attempt = H.attempt_of(headers or None, redelivered, count_header=count.header, returned=0)
        forged = False
    except H.BadAttemptHeader:
        attempt, forged = 1, True
    expected = arrival(
        mode=mode,
        unreadable=False,
        forged=forged,
        attempt=attempt,
        max_attempts=policy.retry.max_attempts,
        redelivered=redelivered,
        count=count,
    )
    assert (t.verdict is None) == (expected is Arrival.RUN)
