"""Crash loops are bounded with any max_attempts, the default one included: a message
whose handler run is lost (its consumer died or disconnected) again and again ends in
the DLQ, while explicit requeues loop as RabbitMQ does (the source documents)."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from ackkit import AckMode, RequeueMessage
from ackkit._core import headers as H
from ackkit._core.actions import Ack, CopyPurpose, Republish
from ackkit._core.listener import ListenerCore
from ackkit._core.policy import ListenerPolicy
from ackkit._core.wire import decode_table, encode_table


def core(**kw: Any) -> ListenerCore:
    kw.setdefault("name", "l")
    kw.setdefault("queue", "q")
    c = ListenerCore(ListenerPolicy(**kw), wallclock=lambda: 0.0)
    c.channel_opened()
    return c


def test_a_redelivery_runs_on_a_copy_counting_one_more_lost_run() -> None:
    c = core()
    t = c.receive(1, redelivered=True, headers={"x": 1}, message_id="m")
    assert t.verdict is None and t.lost == 0
    (copy,) = c.shutdown.start(t) or []
    assert isinstance(copy, Republish) and copy.purpose is CopyPurpose.RESTAMP
    assert copy.set_headers[H.LOST] == 1 and copy.set_headers[H.ATTEMPT] == t.attempt
    assert c.republished(copy.token, True) + c.drain() == [Ack(1, multiple=False)]
    t2 = c.receive(2, redelivered=False, headers={"x": 1, H.LOST: 1}, message_id="m")
    assert c.shutdown.start(t2) is None  # the copy's first delivery runs


def test_past_the_bound_a_redelivery_is_dead_lettered() -> None:
    c = core()
    t = c.receive(1, redelivered=True, headers={H.LOST: H.LOST_BOUND})
    assert t.verdict is not None
    (dead,) = t.verdict
    assert isinstance(dead, Republish) and dead.purpose is CopyPurpose.DEAD_LETTER
    assert dead.set_headers[H.REASON] == (
        f"consumer died or lost its connection {H.LOST_BOUND} times while handling it"
    )


def test_a_hostile_lost_header_saturates_and_a_float_counts_as_nothing() -> None:
    c = core()
    t = c.receive(1, redelivered=True, headers={H.LOST: 2**63 - 1})
    assert t.verdict and t.verdict[0].set_headers[H.REASON].endswith(  # type: ignore[union-attr]
        f"{H.LOST_BOUND} times while handling it"
    )
    wire, _ = decode_table(encode_table({H.LOST: 2.0}))
    t = c.receive(2, redelivered=True, headers={H.LOST: 2}, wire_headers=wire)  # pika's int
    assert t.verdict is None and t.lost == 0


def test_an_explicit_requeue_is_no_lost_run() -> None:
    c = core(mode=AckMode.MANUAL)
    for tag in range(1, 50):
        t = c.receive(tag, redelivered=tag > 1, message_id="m")
        assert t.verdict is None and t.lost is None
        assert c.shutdown.start(t) is None
        c.settle(t, "reject", requeue=True)
    c = core()
    for tag in range(1, 50):
        t = c.receive(tag, redelivered=tag > 1)  # no message id: known by its route
        assert c.shutdown.start(t) is None
        c.handled([t], exc=RequeueMessage("again"))


def test_a_stop_returns_a_suspect_without_charging_it() -> None:
    c = core()
    t = c.receive(1, redelivered=True, headers={H.LOST: 2})
    c.shutdown.stop()
    (copy,) = c.shutdown.start(t) or []
    assert isinstance(copy, Republish) and H.LOST not in copy.set_headers  # kept as it was


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(["run lost", "prefetch lost", "requeue"]), max_size=40))
def test_lost_runs_are_bounded_and_requeues_never_count(events: list[str]) -> None:
    """One message through a model broker: each event is what ends one delivery of it (a
    lost handler run: the process dies; lost while prefetched; an explicit requeue in
    the same process). It is dead-lettered only after at least LOST_BOUND runs that
    followed a loss ended unsettled (lost, or requeued: the count is stamped before the
    run), and at the latest at the delivery after LOST_BOUND + 1 lost runs."""
    headers: dict[str, Any] = {}
    redelivered = False
    c = core(mode=AckMode.MANUAL)
    tag = 0
    lost_runs = 0
    charged_unsettled = 0
    for event in [*events, "end"]:
        tag += 1
        t = c.receive(tag, redelivered, dict(headers), message_id="m")
        if t.verdict:
            assert t.verdict[0].purpose is CopyPurpose.DEAD_LETTER  # type: ignore[union-attr]
            assert charged_unsettled >= H.LOST_BOUND
            return
        assert lost_runs <= H.LOST_BOUND
        if event == "end":
            return
        if event == "prefetch lost":
            c, redelivered = core(mode=AckMode.MANUAL), True
            continue
        acts = c.shutdown.start(t)
        charged_unsettled += bool(acts)
        if acts:  # the handler runs on a copy: it replaces the message in the queue
            (copy,) = acts
            assert isinstance(copy, Republish)
            headers.update({k: v for k, v in copy.set_headers.items() if v is not None})
            c.republished(copy.token, True)
            tag += 1
            t = c.receive(tag, False, dict(headers), message_id="m")
            assert c.shutdown.start(t) is None
        if event == "run lost":
            lost_runs += 1
            c, redelivered = core(mode=AckMode.MANUAL), True
        else:
            c.settle(t, "reject", requeue=True)
            redelivered = True
