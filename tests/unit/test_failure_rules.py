"""What a failed delivery becomes: the table of `failure.decide`, and the core carrying it out.

`decide(policy, attempt, exc)` is one pure rule. The table below names every
kind of exception a handler may raise against the policies that change the
answer (ack mode, dead-letter queue or none, broker or in-process retry, max
attempts) and the attempt the delivery is at. A generated sweep then checks the
rule's invariants, and that `ListenerCore.finish` turns each decision into the
matching channel actions.
"""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ackkit import (
    AckMode,
    DeadLetterMessage,
    RejectMessage,
    RequeueMessage,
    Retry,
    RetryLater,
    RetryStrategy,
)
from ackkit._core import headers as H
from ackkit._core.actions import CopyPurpose, Reinvoke, Reject, Republish
from ackkit._core.failure import MAX_RETRY_DELAY, Failure, Fate, decide
from ackkit._core.listener import ListenerCore
from ackkit._core.policy import ListenerPolicy
from ackkit.errors import BadPayload

BROKER = RetryStrategy.BROKER
IN_PROC = RetryStrategy.IN_PROCESS


def policy(
    *,
    mode: AckMode = AckMode.AUTO,
    dlq: bool = True,
    attempts: int = 3,
    strategy: RetryStrategy = BROKER,
    fatal: tuple[type[BaseException], ...] = (),
    retry_on: tuple[type[BaseException], ...] = (Exception,),
) -> ListenerPolicy:
    retry = Retry(
        max_attempts=attempts,
        initial_interval=1.0,
        multiplier=2.0,
        max_interval=30.0,
        strategy=strategy,
        fatal=fatal,
        retry_on=retry_on,
    )
    return ListenerPolicy(
        name="l", queue="q", mode=mode, retry=retry, dead_letter="{queue}.dlq" if dlq else None
    )


DL, RJ, RQ = Fate.DEAD_LETTER, Fate.REJECT, Fate.REQUEUE
TABLE: list[tuple[str, BaseException, dict[str, Any], int, Failure]] = [
    # handler signals
    ("requeue", RequeueMessage("busy"), {}, 1, Failure(RQ, "busy")),
    ("requeue at the last attempt", RequeueMessage("busy"), {}, 3, Failure(RQ, "busy")),
    ("requeue, no dlq", RequeueMessage("busy"), {"dlq": False}, 1, Failure(RQ, "busy")),
    ("reject", RejectMessage("no"), {}, 1, Failure(DL, "no")),
    ("reject, no dlq", RejectMessage("no"), {"dlq": False}, 1, Failure(RJ, "no")),
    ("dead-letter", DeadLetterMessage("bye"), {}, 1, Failure(DL, "bye")),
    ("dead-letter, no dlq", DeadLetterMessage("bye"), {"dlq": False}, 1, Failure(RJ, "bye")),
    ("bad payload", BadPayload("not json"), {}, 1, Failure(DL, "bad payload: not json")),
    ("bad payload, no dlq", BadPayload("x"), {"dlq": False}, 1, Failure(RJ, "bad payload: x")),
    # ordinary exceptions
    (
        "retryable, broker",
        ValueError("v"),
        {},
        1,
        Failure(Fate.RETRY_BROKER, "ValueError: v", delay_ms=1000),
    ),
    (
        "retryable, broker, second tier",
        ValueError("v"),
        {},
        2,
        Failure(Fate.RETRY_BROKER, "ValueError: v", delay_ms=2000),
    ),
    (
        "retryable, in process",
        ValueError("v"),
        {"strategy": IN_PROC},
        2,
        Failure(Fate.RETRY_IN_PROCESS, "ValueError: v", delay=2.0),
    ),
    ("exhausted", ValueError("v"), {}, 3, Failure(DL, "attempts exhausted (3 of 3)")),
    (
        "past max",
        ValueError("v"),
        {},
        7,
        Failure(
            DL, "attempts exhausted (7 of 3: 4 more after outcomes that did not reach the broker)"
        ),
    ),
    ("no retries", ValueError("v"), {"attempts": 1}, 1, Failure(DL, "attempts exhausted (1 of 1)")),
    (
        "exhausted, no dlq",
        ValueError("v"),
        {"dlq": False},
        3,
        Failure(RJ, "attempts exhausted (3 of 3)"),
    ),
    ("fatal", KeyError("k"), {"fatal": (KeyError,)}, 1, Failure(DL, "non-retryable KeyError")),
    # the reason names the type as ackkit-error-type does: qualified, builtins without
    (
        "fatal, qualified",
        json.JSONDecodeError("j", "", 0),
        {"fatal": (ValueError,)},
        1,
        Failure(DL, "non-retryable json.decoder.JSONDecodeError"),
    ),
    (
        "not in retry_on",
        TypeError("t"),
        {"retry_on": (ValueError,)},
        1,
        Failure(DL, "non-retryable TypeError"),
    ),
    # RetryLater: retried even when retry_on would not, within max attempts
    (
        "retry later, policy backoff",
        RetryLater("later"),
        {"retry_on": (ValueError,)},
        1,
        Failure(Fate.RETRY_BROKER, "RetryLater: later", delay_ms=1000),
    ),
    (
        "retry later, own delay",
        RetryLater("later", delay=7.5),
        {},
        1,
        Failure(Fate.RETRY_BROKER, "RetryLater: later", delay_ms=7500, asked=True),
    ),
    (
        "retry later, own delay, in process",
        RetryLater("later", delay=0.25),
        {"strategy": IN_PROC},
        1,
        Failure(Fate.RETRY_IN_PROCESS, "RetryLater: later", delay=0.25, asked=True),
    ),
    (
        "retry later, negative delay",
        RetryLater("later", delay=-5),
        {"strategy": IN_PROC},
        1,
        Failure(Fate.RETRY_IN_PROCESS, "RetryLater: later", delay=0.0, asked=True),
    ),
    (
        "retry later, NaN delay: the policy's",
        RetryLater("later", delay=math.nan),
        {"strategy": IN_PROC},
        1,
        Failure(Fate.RETRY_IN_PROCESS, "RetryLater: later", delay=1.0),
    ),
    (
        "retry later, huge delay: capped",
        RetryLater("later", delay=1e12),
        {"strategy": IN_PROC},
        1,
        Failure(Fate.RETRY_IN_PROCESS, "RetryLater: later", delay=MAX_RETRY_DELAY, asked=True),
    ),
    (
        "retry later, exhausted",
        RetryLater("later", delay=1),
        {},
        3,
        Failure(DL, "attempts exhausted (3 of 3)"),
    ),
    # AckMode.NONE: the broker forgot the message; only a dead letter is left
    (
        "no-ack",
        ValueError("v"),
        {"mode": AckMode.NONE, "attempts": 1},
        1,
        Failure(DL, "handler failed: ValueError: v"),
    ),
    (
        "no-ack requeue",
        RequeueMessage("r"),
        {"mode": AckMode.NONE, "attempts": 1},
        1,
        Failure(DL, "handler failed: ackkit.RequeueMessage: r"),
    ),
    (
        "no-ack, no dlq",
        ValueError("v"),
        {"mode": AckMode.NONE, "attempts": 1, "dlq": False},
        1,
        Failure(Fate.LOST, "lost (no-ack, no DLQ): ValueError: v"),
    ),
]


@pytest.mark.parametrize(
    ("exc", "kw", "attempt", "want"),
    [row[1:] for row in TABLE],
    ids=[row[0] for row in TABLE],
)
def test_decide_table(exc: BaseException, kw: dict[str, Any], attempt: int, want: Failure) -> None:
    assert decide(policy(**kw), attempt, exc) == want


EXCEPTIONS = st.sampled_from(
    [
        RequeueMessage("r"),
        RejectMessage("j"),
        DeadLetterMessage("d"),
        BadPayload("b"),
        RetryLater("l"),
        RetryLater("l", delay=3),
        RetryLater("l", delay=-1),
        RetryLater("l", delay=math.inf),
        RetryLater("l", delay="soon"),  # type: ignore[arg-type]
        ValueError("v"),
        KeyError("k"),
        TypeError("t"),
        RuntimeError("x"),
    ]
)


@st.composite
def cases(draw: st.DrawFn) -> tuple[ListenerPolicy, int, BaseException]:
    mode = draw(st.sampled_from(list(AckMode)))
    attempts = 1 if mode is AckMode.NONE else draw(st.integers(1, 6))
    p = policy(
        mode=mode,
        dlq=draw(st.booleans()),
        attempts=attempts,
        strategy=draw(st.sampled_from([BROKER, IN_PROC])),
        fatal=draw(st.sampled_from([(), (KeyError,)])),
        retry_on=draw(st.sampled_from([(Exception,), (ValueError, KeyError)])),
    )
    return p, draw(st.integers(1, 8)), draw(EXCEPTIONS)


@settings(max_examples=300, deadline=None)
@given(cases())
def test_decide_invariants(case: tuple[ListenerPolicy, int, BaseException]) -> None:
    p, attempt, exc = case
    f = decide(p, attempt, exc)
    has_dlq = p.dead_letter_queue is not None
    if f.fate in (Fate.RETRY_BROKER, Fate.RETRY_IN_PROCESS):
        assert attempt < p.retry.max_attempts  # never past max attempts
        assert not isinstance(exc, (RequeueMessage, RejectMessage, DeadLetterMessage, BadPayload))
        assert (f.fate is Fate.RETRY_IN_PROCESS) == (p.retry.strategy is IN_PROC)
        assert 0 <= f.delay <= MAX_RETRY_DELAY
        if f.fate is Fate.RETRY_BROKER and not f.asked:
            assert f.delay_ms in p.retry.delay_tiers_ms()  # a declared tier
    assert (f.fate is Fate.REQUEUE) == (
        isinstance(exc, RequeueMessage) and p.mode is not AckMode.NONE
    )
    assert (f.fate is Fate.LOST) == (p.mode is AckMode.NONE and not has_dlq)
    if f.fate is Fate.DEAD_LETTER:
        assert has_dlq
    if f.fate is Fate.REJECT:
        assert not has_dlq
    assert f.reason  # every decision says why


@settings(max_examples=200, deadline=None)
@given(cases())
def test_the_core_carries_out_the_decision(case: tuple[ListenerPolicy, int, BaseException]) -> None:
    p, attempt, exc = case
    f = decide(p, attempt, exc)
    c = ListenerCore(p, wallclock=lambda: 0.0)
    c.channel_opened()
    t = c.receive(1, headers={H.ATTEMPT: attempt} if attempt > 1 else None)
    if t.verdict is not None:  # a delivery past max attempts never reaches the handler
        assert attempt > p.retry.max_attempts > 1
        return
    acts = c.finish(t, exc)
    if f.fate is Fate.LOST:
        assert acts == []
    elif f.fate is Fate.REQUEUE:
        assert acts == [Reject(1, requeue=True)]
    elif f.fate is Fate.REJECT:
        assert acts == [Reject(1, requeue=False)]
    elif f.fate is Fate.RETRY_IN_PROCESS:
        # not an action: the core's record, which `handled` turns into Outcome.rerun
        assert acts == [] and t.again == Reinvoke(1, f.delay, attempt + 1)  # no jitter
    else:
        (act,) = acts
        assert isinstance(act, Republish)
        if f.fate is Fate.DEAD_LETTER:
            assert act.purpose == "dead-letter" and act.purpose is CopyPurpose.DEAD_LETTER
            assert act.routing_key == p.dead_letter_queue
            assert act.set_headers[H.REASON] == f.reason
        else:
            assert act.purpose == "retry"
            assert act.routing_key == p.delay_queue(f.delay_ms)
            assert act.set_headers[H.ATTEMPT] == attempt + 1
