"""The stream source's offset planning (ackkit.spark._core.stream_offsets): pure decisions."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ackkit.spark._core.stream_offsets import (
    Loss,
    Range,
    RangeCursor,
    StartFrom,
    StartingPosition,
    admit,
    from_json,
    initial_positions,
    losses,
    lost_in,
    plan_end,
    ranges,
    skip_lost,
    to_json,
)

# -- starting positions --------------------------------------------------------------------


def test_starting_position_parses_the_four_forms() -> None:
    assert StartingPosition.parse("earliest") == StartingPosition(StartFrom.EARLIEST)
    assert StartingPosition.parse(" LATEST ") == StartingPosition(StartFrom.LATEST)
    assert StartingPosition.parse("offset:42") == StartingPosition(StartFrom.OFFSET, 42)
    assert StartingPosition.parse("timestamp:1700000000000").value == 1700000000000


@pytest.mark.parametrize("bad", ["", "first", "offset", "offset:x", "offset:-1", "latest:3"])
def test_starting_position_refuses(bad: str) -> None:
    with pytest.raises(ValueError, match="starting_position"):
        StartingPosition.parse(bad)


def test_initial_positions() -> None:
    parts = ["s-1", "s-0", "s-2"]
    firsts = {"s-0": 10, "s-1": 0}
    tails = {"s-0": 50, "s-1": 5}  # s-2: empty
    ear = initial_positions(parts, StartingPosition.parse("earliest"), firsts=firsts, tails=tails)
    assert ear == {"s-0": 10, "s-1": 0, "s-2": 0}
    assert list(ear) == ["s-0", "s-1", "s-2"]
    lat = initial_positions(parts, StartingPosition.parse("latest"), firsts=firsts, tails=tails)
    assert lat == {"s-0": 50, "s-1": 5, "s-2": 0}
    off = initial_positions(parts, StartingPosition.parse("offset:7"), firsts=firsts, tails=tails)
    assert off == {"s-0": 10, "s-1": 5, "s-2": 0}  # clamped to what each stream holds
    ts = initial_positions(
        parts,
        StartingPosition.parse("timestamp:5"),
        firsts=firsts,
        tails=tails,
        at_timestamp={"s-0": 30},
    )
    assert ts == {"s-0": 30, "s-1": 5, "s-2": 0}  # nothing at/after it: from the tail


# -- admission -------------------------------------------------------------------------------


def test_admit_shares_the_budget_fairly() -> None:
    avail = {"a": (0, 100), "b": (10, 12), "c": (5, 1000)}
    assert admit(avail, None) == {"a": 100, "b": 12, "c": 1000}
    assert admit(avail, 62) == {"a": 30, "b": 12, "c": 35}
    assert admit(avail, 0) == {"a": 0, "b": 10, "c": 5}


@given(
    st.dictionaries(
        st.sampled_from("abcdefg"),
        st.tuples(st.integers(0, 50), st.integers(0, 60)).map(lambda t: (t[0], max(t))),
        max_size=7,
    ),
    st.none() | st.integers(0, 200),
)
def test_admit_stays_in_bounds_and_moves(
    avail: dict[str, tuple[int, int]], budget: int | None
) -> None:
    ends = admit(avail, budget)
    assert set(ends) == set(avail)
    total = sum(t - s for s, t in avail.values())
    taken = sum(ends[p] - s for p, (s, _t) in avail.items())
    for p, (s, t) in avail.items():
        assert s <= ends[p] <= t
    if budget is None:
        assert taken == total
    else:
        assert taken == min(budget, total)
        # fair: a partition below another's share was limited by its own data only
        shares = [ends[p] - s for p, (s, _t) in avail.items()]
        for p, (s, t) in avail.items():
            if ends[p] < t:
                assert ends[p] - s + 1 >= max(shares, default=0)


# -- planning and losses ---------------------------------------------------------------------


def test_plan_end_keys_on_names() -> None:
    start = {"s-0": 5, "old": 9}
    end = plan_end(start, {"s-0": 8, "s-1": 3})
    assert end == {"old": 9, "s-0": 8, "s-1": 3}  # old kept, new from 0
    assert ranges(start, end) == [Range("s-0", 5, 8), Range("s-1", 0, 3)]
    # AvailableNow: the cap; partitions absent from it do not move
    assert plan_end(start, {"s-0": 8, "s-1": 3}, cap={"s-0": 6}) == {"old": 9, "s-0": 6, "s-1": 0}


def test_losses_and_skipping_them() -> None:
    start = {"a": 5, "b": 100, "c": 7}
    firsts = {"a": 20, "b": 0, "c": 0}
    tails = {"a": 30, "b": 40, "c": 9}  # b: tail below its position: re-created
    lost = losses(start, firsts, tails)
    assert lost == [Loss("a", 5, 20), Loss("b", 40, 100)]
    assert "fail_on_data_loss=false" in lost[0].message()
    moved, reset = skip_lost(start, lost)
    assert moved == {"a": 20, "b": 0, "c": 7}
    assert reset == {"b"}
    # a new partition whose head retention already removed
    assert losses({}, {"n": 3}, {"n": 10}) == [Loss("n", 0, 3)]


def test_offsets_round_trip_and_name_their_source() -> None:
    off = to_json("orders", {"b": 2, "a": 1})
    assert list(off["positions"]) == ["a", "b"]  # type: ignore[call-overload]
    assert from_json("orders", off) == {"a": 1, "b": 2}
    with pytest.raises(ValueError, match="not one of the stream source 'other'"):
        from_json("other", off)
    with pytest.raises(ValueError):
        from_json("orders", {"ackkit": "orders", "seq": 3})


# -- the executor's cursor -------------------------------------------------------------------


def test_cursor_skips_the_chunk_head_and_stops_at_the_end() -> None:
    c = RangeCursor(Range("s", 5, 8))
    assert [c.offer(o) for o in range(3, 10)] == [False, False, True, True, True, False, False]
    assert c.done and c.gaps == []


def test_cursor_reports_gaps_and_only_those_below_the_first_offset_are_lost() -> None:
    c = RangeCursor(Range("s", 5, 10))
    assert c.offer(7) is True
    assert c.gaps == [Loss("s", 5, 7)]
    assert [c.offer(o) for o in (8, 9)] == [True, True] and c.done
    assert lost_in(c.gaps, 7) == [Loss("s", 5, 7)]  # retention removed 5..6
    assert lost_in(c.gaps, 0) == []  # 5..6 were offset-tracking entries, not messages
    assert lost_in(c.gaps, 6) == [Loss("s", 5, 6)]
    assert lost_in(c.gaps, None) == [Loss("s", 5, 7)]
    whole = RangeCursor(Range("s", 5, 10))
    assert whole.offer(12) is False  # nothing of the range was delivered
    assert whole.done and whole.gaps == [Loss("s", 5, 10)]


# -- the promise: no gap, no overlap, whatever happens to the partitions ---------------------

NAMES = ["p-0", "p-1", "p-2", "p-3"]


@st.composite
def histories(draw: st.DrawFn) -> list[tuple[list[str], dict[str, int], int | None, bool]]:
    """Steps: (partitions the broker lists, in any order; growth of each; budget;
    restart here). A removed partition may come back later."""
    steps = []
    for _ in range(draw(st.integers(1, 12))):
        present = draw(st.lists(st.sampled_from(NAMES), unique=True, max_size=4))
        growth = {p: draw(st.integers(0, 30)) for p in present}
        budget = draw(st.none() | st.integers(0, 40))
        steps.append((present, growth, budget, draw(st.booleans())))
    return steps


@settings(max_examples=300)
@given(histories())
def test_batches_never_leave_a_gap_or_read_twice(
    steps: list[tuple[list[str], dict[str, int], int | None, bool]],
) -> None:
    tails: dict[str, int] = {}
    read: dict[str, list[int]] = {p: [] for p in NAMES}
    checkpoint = to_json("ss", {})  # Spark's offset log: the last end offset
    for present, growth, budget, restart in steps:
        for p in present:
            tails[p] = tails.get(p, 0) + growth[p]
        if restart:  # a restarted query starts from what the checkpoint holds
            checkpoint = dict(to_json("ss", from_json("ss", checkpoint)))
        start = from_json("ss", checkpoint)
        listed = {p: tails[p] for p in present}
        assert losses(start, {p: 0 for p in present}, listed) == []
        end = plan_end(start, listed, budget=budget)
        if budget is not None:
            assert sum(r.count for r in ranges(start, end)) <= budget
        for r in ranges(start, end):
            cursor = RangeCursor(r)
            got = [o for o in range(r.first, tails[r.stream]) if cursor.offer(o)]
            read[r.stream].extend(got)
        checkpoint = to_json("ss", end)
    # drain: everything published is read once all partitions are listed again
    start = from_json("ss", checkpoint)
    end = plan_end(start, tails)
    for r in ranges(start, end):
        read[r.stream].extend(range(r.first, r.until))
    for p in NAMES:
        assert read[p] == list(range(tails.get(p, 0))), p
