"""The core's answer to "the handler returned / raised": every outcome settles every delivery.

`ListenerCore.handled()` takes whatever a handler did (a return value, an
AckIndex, any exception, interpreter-exit signals included) and returns an
Outcome. These tests drive it with generated handler behaviour in every ack
mode and retry strategy and replay the frames on a model of the broker's tag
bookkeeping: nothing may stay unsettled, no frame may name an unknown tag, and
only in-process retries may be left for another run.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ackkit import (
    AckIndex,
    AckMode,
    DeadLetterMessage,
    RejectMessage,
    RequeueMessage,
    Retry,
    RetryLater,
    RetryStrategy,
)
from ackkit._core import headers as H
from ackkit._core.actions import Ack, Action, Nack, Reinvoke, Reject, Republish, TxCommit
from ackkit._core.listener import ListenerCore
from ackkit._core.outcome import succeeded
from ackkit._core.policy import ListenerPolicy
from ackkit.errors import BadPayload


def core(**kw: Any) -> ListenerCore:
    kw.setdefault("name", "l")
    kw.setdefault("queue", "q")
    c = ListenerCore(ListenerPolicy(**kw), wallclock=lambda: 0.0)
    c.channel_opened()
    return c


class Broker:
    """The broker's view of one channel: outstanding tags, and what became of the rest."""

    def __init__(self, tags: list[int]) -> None:
        self.outstanding = set(tags)
        self.acked: set[int] = set()
        self.requeued: set[int] = set()
        self.rejected: set[int] = set()
        self.copies: list[Republish] = []

    def apply(self, acts: list[Action]) -> None:
        for a in acts:
            if isinstance(a, Republish):
                self.copies.append(a)
                continue
            if isinstance(a, TxCommit):
                continue
            assert not isinstance(a, Reinvoke), "a Reinvoke reached the channel"
            assert isinstance(a, Ack | Nack | Reject)
            assert a.tag in self.outstanding, f"unknown delivery tag {a.tag}"
            many = getattr(a, "multiple", False)
            done = {t for t in self.outstanding if t <= a.tag} if many else {a.tag}
            self.outstanding -= done
            if isinstance(a, Ack):
                self.acked |= done
            elif a.requeue:
                self.requeued |= done
            else:
                self.rejected |= done


class Hostile(Exception):
    def __str__(self) -> str:
        raise RuntimeError("str() of this exception fails")


class Odd(BaseException):
    """A BaseException subclass that is not an exit signal."""


RAISED = st.sampled_from(
    [
        ValueError("boom"),
        Hostile(),
        Odd("odd"),
        BadPayload("bad"),
        RequeueMessage(),
        RejectMessage(),
        DeadLetterMessage(),
        RetryLater(),
        RetryLater(delay=math.nan),
        RetryLater(delay=math.inf),
        RetryLater(delay=-5.0),
        RetryLater(delay=0.01),
        SystemExit(3),
        KeyboardInterrupt(),
        ValueError("\ud800 lone surrogate"),
    ]
)
RETURNED = st.one_of(
    st.none(),
    st.integers(),
    st.builds(AckIndex, st.integers(-5, 10)),
    st.builds(AckIndex, st.sampled_from([True, 1.5, "2", None])),
)
MODES = st.sampled_from([m for m in AckMode if m is not AckMode.NONE])
RETRIES = st.sampled_from(
    [
        Retry(),
        Retry(max_attempts=3, initial_interval=0.1),
        Retry(max_attempts=3, initial_interval=0.1, strategy=RetryStrategy.IN_PROCESS),
    ]
)


@settings(max_examples=300, deadline=None)
@given(
    mode=MODES,
    retry=RETRIES,
    size=st.integers(1, 6),
    is_batch=st.booleans(),
    raised=st.one_of(st.none(), RAISED),
    returned=RETURNED,
    dlq=st.booleans(),
    confirm=st.booleans(),
)
def test_every_outcome_settles_every_delivery(
    mode: AckMode,
    retry: Retry,
    size: int,
    is_batch: bool,
    raised: BaseException | None,
    returned: object,
    dlq: bool,
    confirm: bool,
) -> None:
    size = size if is_batch else 1
    c = core(mode=mode, retry=retry, prefetch=10, dead_letter="{queue}.dlq" if dlq else None)
    ts = [c.receive(tag) for tag in range(1, size + 1)]
    broker = Broker([t.tag for t in ts])
    out = c.handled(ts, returned, raised, is_batch=is_batch)
    broker.apply(out.actions)
    # CLIENT mode: a delivery returned without settling waits for a later multiple ack.
    parked = {t.tag for t in ts if t.parked}
    assert not parked or mode is AckMode.CLIENT
    if isinstance(raised, SystemExit | KeyboardInterrupt):
        assert out.stop is raised
        assert not out.run
    else:
        assert out.stop is None
    for t in ts:
        assert t.settled or t in out.run or t.parked, f"{t} left undecided"
    if out.run:
        assert retry.strategy is RetryStrategy.IN_PROCESS
        assert math.isfinite(out.delay) and 0 <= out.delay <= 24 * 3600
    # The broker confirms (or refuses) every copy; then all is flushed.
    # A refused copy may be followed by another (a minimal one): bounded, then settled.
    for _ in range(50):
        if not broker.copies:
            break
        a = broker.copies.pop(0)
        assert a.set_headers.get(H.ERROR_MESSAGE, "") is not None
        broker.apply(c.republished(a.token, confirm))
    assert not broker.copies, "copies kept coming"
    broker.apply(c.drain())
    left = {t.tag for t in out.run} | parked
    assert broker.outstanding == left, "a delivery is neither settled nor being retried"


@pytest.mark.parametrize(
    ("result", "size", "done"),
    [
        (None, 3, 3),
        (AckIndex(0), 3, 1),
        (AckIndex(-1), 3, 0),
        (AckIndex(-9), 3, 0),
        (AckIndex(99), 3, 3),
        (AckIndex(True), 3, 0),  # not an index: nothing counts as done
        (AckIndex("1"), 3, 0),  # type: ignore[arg-type]
        ("anything else", 3, 3),
    ],
)
def test_what_a_batch_handler_returned_counts_as_done(result: object, size: int, done: int) -> None:
    assert succeeded(result, size, batch=True) == done


def test_transacted_with_in_process_retry_reruns_the_failed_delivery() -> None:
    """finish() used to return [Reject(pending, requeue), Reinvoke(...)]; the runtimes only
    honoured a Reinvoke that came first, so the failed delivery was never run again."""
    retry = Retry(max_attempts=3, initial_interval=0.1, strategy=RetryStrategy.IN_PROCESS)
    c = core(mode=AckMode.TRANSACTED, retry=retry, prefetch=10)
    ok, bad = c.receive(1), c.receive(2)
    broker = Broker([1, 2])
    broker.apply(c.handled([ok]).actions)  # settled in the open transaction
    out = c.handled([bad], None, ValueError("boom"))
    broker.apply(out.actions)
    assert out.run == (bad,) and out.delay == pytest.approx(0.1)
    assert broker.requeued == {1}  # the transaction rolled back: its ack became a requeue
    out = c.handled([bad])
    broker.apply(out.actions + c.drain())
    assert broker.acked == {2} and not broker.outstanding


def test_exit_signal_requeues_and_asks_to_stop() -> None:
    c = core(retry=Retry(max_attempts=3))
    t = c.receive(1)
    exc = KeyboardInterrupt()
    out = c.handled([t], None, exc)
    assert out.actions == [Reject(1, requeue=True)] and out.stop is exc


@pytest.mark.parametrize("delay", [math.nan, math.inf, -1.0, 10.0**12])
def test_retry_later_with_an_insane_delay_still_retries(delay: float) -> None:
    c = core(retry=Retry(max_attempts=3, initial_interval=0.25))
    t = c.receive(1)
    [a] = c.handled([t], None, RetryLater(delay=delay)).actions
    assert isinstance(a, Republish) and a.purpose == "retry"
    ms = int(a.routing_key.rsplit(".", 1)[1][:-2])
    assert 1 <= ms <= 24 * 3600 * 1000


def test_multiple_requeue_does_not_cover_a_delivery_whose_copy_awaits_its_confirm() -> None:
    """MANUAL, concurrency 2: delivery 1 is rejected (its dead-letter copy is not confirmed
    yet); the handler of 2 nacks multiple with requeue. A multiple frame would requeue 1
    as well: handled again and dead-lettered twice, and the core raised IndexError when
    the first copy's confirm came."""
    c = core(mode=AckMode.MANUAL, prefetch=10)
    t1, t2, t3 = c.receive(1), c.receive(2), c.receive(3)
    broker = Broker([1, 2, 3])
    [copy] = c.settle(t1, "reject")
    assert isinstance(copy, Republish)
    broker.apply(c.settle(t3, "nack", requeue=True, multiple=True))
    assert broker.requeued == {2, 3} and 1 in broker.outstanding
    broker.apply(c.republished(copy.token, True))
    assert broker.acked == {1} and not broker.outstanding
    with pytest.raises(Exception, match="already settled"):
        c.settle(t2, "ack")


def test_multiple_requeue_with_nothing_decided_is_one_frame() -> None:
    c = core(mode=AckMode.MANUAL, prefetch=10)
    ts = [c.receive(tag) for tag in (1, 2, 3)]
    assert c.settle(ts[2], "nack", requeue=True, multiple=True) == [Nack(3, True, True)]
