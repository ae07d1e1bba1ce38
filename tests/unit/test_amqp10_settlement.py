"""The AMQP 1.0 rules of the core, without a broker: which outcome settles each action
(`ackkit._core.settlement`), where attempts are read from (`BrokerTraits.count_source`,
`attempt_of(count=...)`), which brokers and listener options are refused."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ackkit._core import headers as H
from ackkit._core.actions import Ack, CopyPurpose, Nack, Reject, Republish
from ackkit._core.brokers import V3, V40, V43, CountSource, amqp10_traits, traits_for
from ackkit._core.listener import ListenerCore
from ackkit._core.policy import AckMode, ListenerPolicy
from ackkit._core.settlement import Outcome, outcome, unsupported

tags = st.integers(1, 2**63 - 1)


@given(tag=tags, multiple=st.booleans(), requeue=st.booleans(), counts=st.booleans())
def test_every_settle_action_has_the_outcome_of_what_it_means(
    tag: int, multiple: bool, requeue: bool, counts: bool
) -> None:
    assert outcome(Ack(tag, multiple)) is Outcome.ACCEPTED
    nack = outcome(Nack(tag, multiple, requeue, counts=counts))
    reject = outcome(Reject(tag, requeue))
    if not requeue:  # the queue's dead-letter route
        assert nack is Outcome.REJECTED and reject is Outcome.REJECTED
        return
    assert reject is Outcome.MODIFIED  # a failed attempt: counted by the broker
    assert nack is (Outcome.MODIFIED if counts else Outcome.RELEASED)


def amqp10_core(queue_type: str | None = None, **kw: Any) -> ListenerCore:
    kw.setdefault("mode", AckMode.AUTO)
    policy = ListenerPolicy(name="l", queue="q", queue_type=queue_type, **kw)
    c = ListenerCore(policy, wallclock=lambda: 0.0)
    c.use_broker(amqp10_traits(traits_for("4.3.6"), "amqp://h"))
    c.channel_opened()
    return c


@given(n=st.integers(1, 20), started=st.integers(0, 20))
def test_a_stop_releases_what_never_started_on_a_classic_queue(n: int, started: int) -> None:
    """Over AMQP 1.0 a classic queue counts attempts in the header's delivery-count,
    which a release does not raise: unstarted deliveries go back as they are (no copy),
    as releases; over 0-9-1 the same stop publishes copies that keep the attempt."""
    c = amqp10_core()
    ts = [c.receive(i + 1) for i in range(n)]
    for t in ts[: min(started, n)]:
        assert c.shutdown.start(t) is None
    c.shutdown.stop()
    for t in ts[min(started, n) :]:
        (back,) = c.shutdown.start(t)
        assert back == Nack(t.tag, requeue=True)
        assert outcome(back) is Outcome.RELEASED


def test_a_quorum_queue_on_43_keeps_the_copy_that_keeps_the_attempt() -> None:
    """A quorum queue on 4.3 counts x-acquired-count, which a release raises: the stop
    keeps its attempt on a copy there, over AMQP 1.0 as over 0-9-1."""
    c = amqp10_core("quorum")
    t1 = c.receive(1)
    c.shutdown.stop()
    (copy,) = c.shutdown.start(t1)
    assert isinstance(copy, Republish) and copy.purpose is CopyPurpose.RESTAMP


def test_a_pause_releases_and_a_handlers_nack_counts() -> None:
    c = amqp10_core(mode=AckMode.MANUAL)
    t1, t2 = c.receive(1), c.receive(2)
    returned = c.gating.hold_back(t1, "paused")
    assert [outcome(a) for a in returned] == [Outcome.RELEASED]
    (nack,) = c.settle(t2, "nack", requeue=True).actions
    assert outcome(nack) is Outcome.MODIFIED  # bounded: the broker counts it


@pytest.mark.parametrize(
    ("base", "queue_type", "source"),
    [
        (V43, "quorum", CountSource.ACQUIRED_COUNT),  # as over 0-9-1: timeouts counted
        (V43, "classic", CountSource.TRANSFER),
        (V43, None, CountSource.TRANSFER),
        (V40, "quorum", CountSource.TRANSFER),
        (V40, "classic", CountSource.TRANSFER),
    ],
)
def test_attempts_over_amqp10_come_from_the_broker(
    base: Any, queue_type: str | None, source: CountSource
) -> None:
    traits = amqp10_traits(traits_for("4.3.6" if base is V43 else "4.1.2"), "amqp://h")
    assert traits.amqp10
    assert traits.count_source(queue_type) is source
    assert base.count_source("classic") is CountSource.REDELIVERED  # 0-9-1 unchanged


@pytest.mark.parametrize("version", ["3.10.8", "3.13.7", "2.8", "nonsense", None])
def test_amqp10_needs_rabbitmq_4(version: Any) -> None:
    with pytest.raises(ValueError, match=r"needs RabbitMQ 4\.0 or later") as e:
        amqp10_traits(traits_for(version), "amqp://guest:***@h:5672/%2f")
    assert "amqp://guest:***@h:5672/%2f" in str(e.value)
    if version and version.startswith("3"):
        assert f"reports RabbitMQ {version}" in str(e.value)
    assert not V3.amqp10


@given(
    count=st.integers(0, 2**32 - 1),
    base=st.one_of(st.none(), st.integers(1, 50)),
    redelivered=st.booleans(),
    forged=st.integers(-(2**40), 2**40),
    returned=st.integers(0, 5),
)
def test_the_transfer_count_is_taken_as_it_is(
    count: int, base: int | None, redelivered: bool, forged: int, returned: int
) -> None:
    """The header's delivery-count is the broker's: a header a publisher wrote never
    changes the attempt, ackkit's own attempt header is its base, and a return ackkit
    made unstarted is not subtracted (the broker did not count it)."""
    headers: dict[str, Any] = {"x-delivery-count": forged, "x-acquired-count": forged}
    if base is not None:
        headers[H.ATTEMPT] = base
    got = H.attempt_of(
        headers, redelivered, count_header=H.X_DELIVERY_COUNT, returned=returned, count=count
    )
    assert got == min((base or 1) + count, H.ATTEMPT_CEILING)


def test_listener_options_amqp10_cannot_carry_are_refused_by_name() -> None:
    assert unsupported("l", AckMode.AUTO, False, {"x-priority": 3}) is None
    assert "TRANSACTED" in (unsupported("l", AckMode.TRANSACTED, False, {}) or "")
    assert "exclusive" in (unsupported("l", AckMode.AUTO, True, {}) or "")
    why = unsupported("l", AckMode.MANUAL, False, {"x-stream-offset": "first", "x-priority": 1})
    assert why is not None and "x-stream-offset" in why and why.startswith("l: ")


@pytest.mark.parametrize(
    ("count", "first", "acquired", "again", "seen_as"),
    [
        (0, True, False, False, "a first delivery"),
        (0, True, True, False, "a publisher's forged x-acquired-count (4.3 passes it on)"),
        (0, False, False, False, "a retry copy dead-lettered back from its delay queue"),
        (0, False, True, True, "released by a consumer timeout, acquired again"),
        (1, False, True, True, "modified(delivery-failed), or a lost consumer"),
        (3, True, False, True, "a counted delivery, whatever the flag says"),
    ],
)
def test_what_counts_as_a_redelivery_over_amqp10(
    count: int, first: bool, acquired: bool, again: bool, seen_as: str
) -> None:
    from ackkit._core.settlement import redelivered

    assert redelivered(count, first, acquired) is again, seen_as
