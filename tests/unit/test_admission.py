"""The admission decisions of the Spark queue source (ackkit/spark/_core/admission.py), no broker.

`admit`: how many waiting deliveries a batch takes under maxMessagesPerTrigger and
maxBytesPerTrigger. `AvailableNowRun`: which deliveries belong to a Trigger.AvailableNow
run, and when it is over. Properties over any sizes and caps, plus the options that set
them (`SourceOptions.parse`)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ackkit.spark._core.admission import AvailableNowRun, Limits, admit

sizes_st = st.lists(st.integers(0, 5000), max_size=60)
limits_st = st.builds(Limits, st.integers(1, 30), st.one_of(st.none(), st.integers(1, 20_000)))


@given(sizes=sizes_st, limits=limits_st)
def test_admit_takes_the_longest_prefix_within_both_caps(sizes: list[int], limits: Limits) -> None:
    n = admit(sizes, limits)
    taken = sizes[:n]
    assert 0 <= n <= min(len(sizes), limits.max_messages)
    if sizes:
        assert n >= 1  # a batch never starves: one message larger than the cap goes alone
    if limits.max_bytes is not None and n > 1:
        assert sum(taken) <= limits.max_bytes
    if n < len(sizes):  # stopped: the next one would break a cap
        over_bytes = limits.max_bytes is not None and sum(sizes[: n + 1]) > limits.max_bytes
        assert n == limits.max_messages or over_bytes


def test_admit_examples() -> None:
    assert admit([], Limits(5)) == 0
    assert admit([10] * 8, Limits(5)) == 5
    assert admit([10] * 8, Limits(5, max_bytes=25)) == 2
    assert admit([100, 1, 1], Limits(5, max_bytes=10)) == 1  # alone, although larger
    assert admit([4, 4, 4], Limits(5, max_bytes=12)) == 3  # exactly the cap fits
    assert admit(iter([1] * 1000), Limits(3)) == 3  # reads no further than it needs


@pytest.mark.parametrize("bad", [(0, None), (1, 0), (3, -1)])
def test_limits_refuse_caps_below_one(bad: tuple[int, int | None]) -> None:
    with pytest.raises(ValueError, match="must be >= 1"):
        Limits(*bad)


# -- Trigger.AvailableNow runs -------------------------------------------------------------


def counted(depth: int, generation: int = 1, received: int = 0) -> AvailableNowRun:
    run = AvailableNowRun(stall=60.0)
    assert run.needs_count(generation)
    run.counted(generation, received, depth, now=0.0)
    run.consuming(generation)
    return run


@given(depth=st.integers(0, 50), before=st.integers(0, 1000), extra=st.integers(0, 50))
def test_a_run_is_the_first_depth_deliveries_of_the_counted_channel(
    depth: int, before: int, extra: int
) -> None:
    run = counted(depth, generation=3, received=before)
    tags = range(1, depth + extra + 1)
    assert [t for t in tags if run.eligible(3, t)] == list(range(1, depth + 1))
    assert not any(run.eligible(2, t) or run.eligible(4, t) for t in tags)
    # Not over while a counted delivery is due or waits; over once all came and went.
    for got in range(depth):
        assert not run.complete(before + got, waiting=0, now=1.0)
    assert not run.complete(before + depth + extra, waiting=1, now=1.0)
    assert run.complete(before + depth + extra, waiting=0, now=1.0)
    assert run.ended is None


def test_an_empty_queue_makes_a_run_that_is_over_at_once() -> None:
    assert counted(0).complete(received=0, waiting=0, now=0.0)


def test_not_counted_yet_is_never_complete() -> None:
    run = AvailableNowRun()
    assert run.needs_count(1)
    assert not run.complete(received=10, waiting=0, now=1e9)
    assert not run.eligible(1, 1)


def test_a_channel_lost_before_consuming_is_counted_again_on_the_next() -> None:
    run = AvailableNowRun()
    run.counted(1, received=0, depth=10, now=0.0)
    run.channel_lost(1)  # e.g. basic.consume refused: another consumer still holds the queue
    assert run.ended is None
    assert run.needs_count(2)
    run.counted(2, received=0, depth=12, now=1.0)
    run.consuming(2)
    assert run.eligible(2, 12) and not run.eligible(2, 13) and not run.eligible(1, 1)
    assert not run.needs_count(3)


def test_a_channel_lost_while_consuming_ends_the_run_once_nothing_waits() -> None:
    run = counted(10, generation=1)
    run.channel_lost(1)
    assert run.ended is not None and "lost" in run.ended
    assert not run.eligible(1, 5)  # the broker requeued them: for the next run
    assert not run.needs_count(2)  # a new channel does not start the run over
    assert not run.complete(received=4, waiting=1, now=1.0)
    assert run.complete(received=4, waiting=0, now=1.0)


def test_a_run_whose_messages_stop_arriving_ends_after_the_stall() -> None:
    run = AvailableNowRun(stall=30.0)
    run.counted(1, received=100, depth=10, now=0.0)
    run.consuming(1)
    assert not run.complete(received=104, waiting=0, now=10.0)  # progress: the clock restarts
    assert not run.complete(received=104, waiting=0, now=39.0)
    assert not run.complete(received=104, waiting=2, now=100.0)  # some still wait
    assert run.complete(received=104, waiting=0, now=41.0)
    assert run.ended is not None and "6 of the 10" in run.ended


def test_a_negative_depth_is_refused() -> None:
    with pytest.raises(ValueError):
        AvailableNowRun().counted(1, 0, -1, 0.0)


# -- the options that set the caps -------------------------------------------------------


def parse(**options: str) -> object:
    from ackkit.spark._options import SourceOptions

    base = {"url": "amqp://localhost/", "queue": "q", "checkpoint": "/tmp/ck"}
    return SourceOptions.parse({**base, **options})


def test_max_messages_per_trigger_is_max_batch_under_sparks_name() -> None:
    pytest.importorskip("pyspark")
    assert parse(maxMessagesPerTrigger="250").max_batch == 250  # type: ignore[attr-defined]
    assert parse(max_batch="250").max_batch == 250  # type: ignore[attr-defined]
    assert parse(maxMessagesPerTrigger="7", max_batch="7").max_batch == 7  # type: ignore[attr-defined]
    assert parse(maxBytesPerTrigger="1048576").max_bytes == 1 << 20  # type: ignore[attr-defined]
    assert parse().max_bytes is None  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "options,message",
    [
        ({"maxMessagesPerTrigger": "0"}, "maxMessagesPerTrigger must be >= 1, got 0"),
        ({"maxMessagesPerTrigger": "many"}, "maxMessagesPerTrigger must be an integer"),
        ({"maxBytesPerTrigger": "0"}, "maxBytesPerTrigger must be >= 1"),
        ({"maxBytesPerTrigger": "1MB"}, "maxBytesPerTrigger must be an integer"),
        ({"maxMessagesPerTrigger": "5", "max_batch": "6"}, "disagree"),
    ],
)
def test_bad_caps_are_refused_with_the_options_name(options: dict[str, str], message: str) -> None:
    pytest.importorskip("pyspark")
    with pytest.raises(ValueError, match=message):
        parse(**options)


def test_read_stream_refuses_a_bad_cap_before_touching_spark_or_the_broker() -> None:
    pytest.importorskip("pyspark")
    from ackkit.spark import read_stream

    with pytest.raises(ValueError, match="maxBytesPerTrigger must be >= 1, got 0"):
        read_stream(object(), url="amqp://x", queue="q", checkpoint="/tmp/ck", maxBytesPerTrigger=0)
