"""Attempts add up across crash redeliveries, without a broker.

The redelivered flag only says "again": on a classic queue a redelivery is
republished stamped with its attempt (a restamp); a producer's
x-delivery-count is not trusted where the broker does not maintain it; a
redelivery past max_attempts is dead-lettered at receive, its copy carrying
the delivery."""

from __future__ import annotations

from typing import Any

import pytest

from ackkit import Retry
from ackkit._core import headers as H
from ackkit._core.actions import Ack, Republish
from ackkit._interpreter.originals import Originals
from tests.unit._fakes import RETRY3, core


def test_classic_redelivery_goes_back_as_a_copy_that_carries_its_attempt() -> None:
    """The redelivered flag is yes/no: a message that kept killing its consumer came back
    as attempt 2 forever (the chaos run's slow message looped for minutes). Now the
    redelivery is republished to its queue stamped with its attempt, then acked."""
    c = core(retry=RETRY3)
    t = c.receive(1, redelivered=True, headers={}, exchange="ex", routing_key="rk")
    assert t.attempt == 2
    [a] = t.verdict or []
    assert isinstance(a, Republish)
    assert (a.exchange, a.routing_key, a.purpose) == ("", "q", "restamp")
    assert a.set_headers[H.ATTEMPT] == 2
    assert a.set_headers[H.X_DELIVERY_COUNT] is None
    assert a.set_headers[H.ORIGINAL_EXCHANGE] == "ex"
    assert a.set_headers[H.ORIGINAL_ROUTING_KEY] == "rk"
    assert c.republished(a.token, True) == [Ack(1)]  # the original goes once the copy is safe


def test_a_message_that_always_kills_its_consumer_reaches_the_dlq_after_max_attempts() -> None:
    """Deliver, lose the consumer, redeliver ... on a classic queue: the handler runs
    exactly max_attempts times, then the redelivery goes to the DLQ without running."""
    headers: dict[str, Any] = {}
    redelivered = False
    runs = 0
    for _ in range(10):
        c = core(retry=RETRY3)  # a new consumer each time
        t = c.receive(1, redelivered=redelivered, headers=headers)
        if t.verdict is None:
            runs += 1  # the handler runs ... and the consumer dies: redelivered
            redelivered = True
            continue
        [a] = t.verdict
        assert isinstance(a, Republish)
        if a.purpose == "dead-letter":
            assert a.set_headers[H.REASON] == "attempts exhausted (3 of 3, last one lost)"
            break
        assert a.purpose == "restamp"
        headers = {k: v for k, v in a.set_headers.items() if v is not None}
        redelivered = False  # the copy is a new message
    else:
        raise AssertionError("the message looped")
    assert runs == 3


@pytest.mark.parametrize(
    ("retry", "headers", "queue_type"),
    [
        # a quorum queue counts its deliveries itself
        (RETRY3, {H.X_DELIVERY_COUNT: 1}, "quorum"),
        # no retries: a crash redelivery is simply handled again
        (Retry(max_attempts=1), {}, None),
    ],
)
def test_no_restamp_when_the_broker_counts_or_nothing_is_counted(
    retry: Retry, headers: dict[str, Any], queue_type: str | None
) -> None:
    c = core(retry=retry, queue_type=queue_type)
    t = c.receive(1, redelivered=True, headers=headers)
    assert t.verdict is None and t.attempt == 2


@pytest.mark.parametrize("queue_type", [None, "classic", "stream"])
@pytest.mark.parametrize("forged", [0, 1, 2, "1", 999])
def test_a_producers_delivery_count_never_stops_the_counting(
    queue_type: str | None, forged: object
) -> None:
    """Where the broker does not maintain x-delivery-count, a producer's value is
    ignored: every redelivery is restamped with one more attempt until the DLQ."""
    c = core(retry=RETRY3, queue_type=queue_type)
    headers: dict[str, Any] = {H.X_DELIVERY_COUNT: forged}
    first = c.receive(1, redelivered=False, headers=headers)
    assert first.verdict is None and first.attempt == 1
    tag, seen = 2, []
    for _ in range(10):
        t = c.receive(tag, redelivered=True, headers=headers)
        tag += 1
        [a] = t.verdict or []
        seen.append(a.purpose)
        if a.purpose == "dead-letter":
            break
        headers = {**headers, **{k: v for k, v in a.set_headers.items() if v is not None}}
    assert seen == ["restamp", "restamp", "dead-letter"]


def test_restamp_keeps_the_first_origin_of_a_retried_copy() -> None:
    c = core(retry=RETRY3)
    old = {H.ATTEMPT: 2, H.ORIGINAL_EXCHANGE: "orders", H.ORIGINAL_ROUTING_KEY: "new"}
    t = c.receive(7, redelivered=True, headers=old, exchange="", routing_key="q")
    [a] = t.verdict or []
    assert isinstance(a, Republish) and a.set_headers[H.ATTEMPT] == 3
    assert H.ORIGINAL_EXCHANGE not in a.set_headers  # merged into the copy's headers as-is


def test_redelivery_past_max_attempts_reports_the_attempts_made() -> None:
    """Killed in attempt 5 of 5: the redelivery is attempt 6 and never reaches the
    handler; the dead letter said ackkit-attempts 6 next to '5 of 5'."""
    c = core(retry=Retry(max_attempts=5))
    t = c.receive(1, redelivered=True, headers={H.ATTEMPT: 5})
    assert t.attempt == 6 and t.verdict is not None
    (act,) = t.verdict
    assert isinstance(act, Republish)
    assert act.set_headers[H.REASON] == "attempts exhausted (5 of 5, last one lost)"
    assert act.set_headers[H.ATTEMPTS] == 5


@pytest.mark.parametrize(
    "headers",
    [
        {H.ATTEMPT: "abc"},
        {H.ATTEMPT: -1},
        {H.ATTEMPT: 10**12},
        # Redelivered after a consumer loss with its attempts used up.
        {H.ATTEMPT: 6},
    ],
)
def test_verdict_from_receive_copies_the_delivery_the_runtime_built(
    headers: dict[str, Any],
) -> None:
    """receive() decides before the runtime built its Delivery: the verdict's copy must
    still be made of it (a copy without its original once crashed the pika publisher on
    every redelivery of such a message: an endless reconnect loop). The core names the
    tag; the executor's `Originals` turn it into its Delivery when the copy is decided."""
    c = core(retry=Retry(max_attempts=5))
    t = c.receive(1, headers=headers)
    assert t.verdict is not None
    payload = object()
    originals: Originals[object] = Originals()
    originals.put(t.generation, t.tag, payload)
    originals.decided(t.generation, t.verdict)
    (act,) = t.verdict
    assert isinstance(act, Republish)
    assert originals.copy(act.token) is payload
    assert act.routing_key == "q.dlq"


def test_a_copy_sent_once_more_is_made_of_the_same_original() -> None:
    """A lost copy is sent again under a new token (`again_of` the first): its original
    is the first copy's, even once the executor is done with the delivery's tag."""
    c = core(retry=Retry(max_attempts=1))
    t = c.receive(1)
    (first,) = c.finish(t, ValueError("x"))
    assert isinstance(first, Republish) and first.again_of == 0
    originals: Originals[str] = Originals()
    originals.put(t.generation, 1, "d")
    originals.decided(t.generation, [first])
    originals.drop(t.generation, 1)
    (again,) = c.republished(first.token, False, lost="connection reset")
    assert isinstance(again, Republish) and again.again_of == first.token
    originals.decided(t.generation, [again])
    originals.answered(first.token)
    assert originals.copy(again.token) == "d" and originals.copy(first.token) is None
