"""A stop returns each unstarted delivery once (issue item 7): the core's rule.

An unstarted delivery goes back as a copy keeping its attempt; its original is acked
once the copy is confirmed. A copy the stop stops waiting for may be in the queue all
the same, next to its original requeued at the close: so a stopping core has at most
`STOP_COPIES` copies awaiting their confirm, sends the next as each is answered, and
when the stop has no time left (`give_back`) returns the rest as they are."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from ackkit import AckMode
from ackkit._core.actions import Ack, CopyPurpose, Nack, Reject, Republish, TxCommit
from ackkit._core.listener import ListenerCore
from ackkit._core.policy import ListenerPolicy
from ackkit._core.shutdown import STOP_COPIES

N = STOP_COPIES * 2 + 10


def core(**kw: Any) -> ListenerCore:
    kw.setdefault("name", "l")
    kw.setdefault("queue", "q")
    kw.setdefault("prefetch", 0)
    c = ListenerCore(ListenerPolicy(**kw), wallclock=lambda: 0.0)
    c.channel_opened()
    return c


def copies(acts: list[Any]) -> list[Republish]:
    out = [a for a in acts if isinstance(a, Republish)]
    assert all(a.purpose is CopyPurpose.RESTAMP for a in out)
    return out


def stopped_with_unstarted(n: int, **kw: Any) -> tuple[ListenerCore, list[Republish]]:
    """A core stopped with `n` deliveries that never reached a handler, released."""
    c = core(**kw)
    ts = [c.receive(i + 1) for i in range(n)]
    c.shutdown.stop()
    sent: list[Republish] = []
    for t in ts:
        sent.extend(copies(c.shutdown.release(t)))
    return c, sent


def test_a_stop_has_at_most_stop_copies_copies_awaiting_their_confirm() -> None:
    c, sent = stopped_with_unstarted(N)
    assert [a.tag for a in sent] == list(range(1, STOP_COPIES + 1))
    assert c.gauges().republishing == STOP_COPIES
    assert not c.shutdown.quiescent  # the others wait their turn
    acked: list[int] = []
    in_flight = list(sent)
    while in_flight:
        a = in_flight.pop(0)
        acts = c.republished(a.token, True)
        acked.extend(x.tag for x in acts if isinstance(x, Ack))
        nxt = copies(acts)  # each confirm sends the next waiting one's copy
        in_flight.extend(nxt)
        sent.extend(nxt)
        assert c.gauges().republishing <= STOP_COPIES
    assert sorted(a.tag for a in sent) == list(range(1, N + 1))  # one copy each
    assert sorted(acked) == list(range(1, N + 1))  # each original acked once
    assert c.shutdown.quiescent


def test_with_no_time_left_the_waiting_go_back_as_they_are_the_copies_in_flight_settle() -> None:
    c, sent = stopped_with_unstarted(N)
    back = c.shutdown.give_back()
    assert back == [Nack(tag, requeue=True) for tag in range(STOP_COPIES + 1, N + 1)]
    assert not c.shutdown.quiescent  # the copies in flight still await their confirm
    acked = []
    for a in sent:
        acts = c.republished(a.token, True)
        assert not copies(acts)  # no copy more
        acked.extend(x.tag for x in acts if isinstance(x, Ack))
    assert acked == list(range(1, STOP_COPIES + 1))
    assert c.shutdown.quiescent


def test_after_give_back_an_unstarted_delivery_goes_back_without_a_copy() -> None:
    c = core()
    t = c.receive(1)
    c.shutdown.stop()
    assert c.shutdown.give_back() == []
    assert c.shutdown.release(t) == [Nack(1, requeue=True)]
    assert c.shutdown.quiescent


def test_transacted_give_back_commits() -> None:
    c, _ = stopped_with_unstarted(STOP_COPIES + 1, mode=AckMode.TRANSACTED)
    assert c.shutdown.give_back() == [Nack(STOP_COPIES + 1, requeue=True), TxCommit()]


def test_a_closed_channel_drops_the_waiting_the_broker_requeued_them() -> None:
    c, sent = stopped_with_unstarted(STOP_COPIES + 5)
    c.channel_closed()
    assert c.shutdown.quiescent
    assert c.shutdown.give_back() == []
    for a in sent:  # late confirms settle nothing on the new channel
        assert c.republished(a.token, True) == []


@given(
    n=st.integers(min_value=1, max_value=STOP_COPIES + 40),
    answered=st.integers(min_value=0, max_value=2 * STOP_COPIES + 80),
    refused=st.sets(st.integers(min_value=1, max_value=STOP_COPIES + 40), max_size=5),
)
def test_each_unstarted_delivery_goes_back_once_whenever_the_time_runs_out(
    n: int, answered: int, refused: set[int]
) -> None:
    """However many copies are answered before the stop runs out of time, each delivery
    goes back once: by its copy (its original acked once the copy is confirmed), or as
    it is (nacked, no copy ever sent; a refused copy's original rejected to its queue);
    at most STOP_COPIES copies are still unanswered when the stop closes."""
    c, in_flight = stopped_with_unstarted(n)
    copied = {a.tag for a in in_flight}
    confirmed: set[int] = set()
    settled: dict[int, str] = {}

    def take(acts: list[Any]) -> None:
        for a in acts:
            if isinstance(a, Republish):
                in_flight.append(a)
                copied.add(a.tag)
            elif isinstance(a, Ack) and a.multiple:
                for x in range(1, a.tag + 1):
                    settled.setdefault(x, "ack")
            elif isinstance(a, (Ack, Nack, Reject)):
                assert a.tag not in settled, f"{a.tag} settled twice"
                settled[a.tag] = type(a).__name__.lower()

    for _ in range(answered):
        if not in_flight:
            break
        a = in_flight.pop(0)
        ok = a.tag not in refused
        if ok:
            confirmed.add(a.tag)
        take(c.republished(a.token, ok))
    take(c.shutdown.give_back())
    unanswered = {a.tag for a in in_flight}
    assert len(unanswered) <= STOP_COPIES
    assert set(settled) | unanswered == set(range(1, n + 1))
    assert not set(settled) & unanswered
    for tag, how in settled.items():
        if how == "ack":
            assert tag in confirmed  # its copy is in the queue, the original is gone
        elif how == "nack":
            assert tag not in copied  # no copy of it was ever sent
        else:
            assert tag in refused  # the broker refused its copy: the original goes back
    assert c.shutdown.quiescent == (not unanswered)
