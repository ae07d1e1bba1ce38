"""Shutdown as the core's state: a stopping core starts nothing, retries nothing, and says
when it waits for nothing more. The runtimes' stop sequences only carry this out."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from ackkit import AckMode, Retry, RetryStrategy
from ackkit._core import headers as H
from ackkit._core.actions import Ack, CopyPurpose, Nack, Republish, TxCommit
from ackkit._core.events import Stage
from ackkit._core.listener import ListenerCore
from ackkit._core.policy import ListenerPolicy

IN_PROCESS = Retry(max_attempts=3, strategy=RetryStrategy.IN_PROCESS, initial_interval=1.0)


def core(**kw: Any) -> ListenerCore:
    kw.setdefault("name", "l")
    kw.setdefault("queue", "q")
    c = ListenerCore(ListenerPolicy(**kw), wallclock=lambda: 0.0)
    c.channel_opened()
    return c


def given_back(c: ListenerCore, acts: list[Any], tag: int, attempt: int) -> None:
    """`acts` return delivery `tag` unstarted, keeping its attempt: a copy to its queue
    stamped with `attempt`, and once confirmed, the original acked."""
    (copy,) = acts
    assert isinstance(copy, Republish) and copy.purpose is CopyPurpose.RESTAMP
    assert (copy.tag, copy.routing_key, copy.set_headers[H.ATTEMPT]) == (tag, "q", attempt)
    assert not c.shutdown.quiescent  # the copy awaits its confirm
    acks = [a for a in c.republished(copy.token, True) + c.drain() if not isinstance(a, TxCommit)]
    assert acks == [Ack(tag, multiple=False)]


def test_a_running_core_lets_handlers_start() -> None:
    c = core()
    t = c.receive(1)
    assert c.shutdown.start(t) is None
    assert not c.shutdown.stopping and not c.shutdown.quiescent


def test_a_stopping_core_starts_nothing_it_returns_the_delivery() -> None:
    c = core(mode=AckMode.AUTO)
    t1, t2 = c.receive(1), c.receive(2)
    assert c.shutdown.start(t1) is None
    c.handled([t1])  # held for the next multiple ack
    assert c.shutdown.stop() == [Ack(1, multiple=False)]  # the held ack goes out with the stop
    given_back(c, c.shutdown.start(t2), 2, 1)
    assert c.shutdown.start(t2) == []  # once
    assert c.counters.counts[Stage.RETURNED] == 1
    assert c.shutdown.quiescent


def test_a_stale_delivery_is_dropped_not_released() -> None:
    c = core()
    t = c.receive(1)
    c.channel_closed()
    c.channel_opened()
    c.shutdown.stop()
    assert c.shutdown.start(t) == []  # its tag died with its channel; the broker requeued it


def test_a_retry_decided_while_stopping_becomes_a_release() -> None:
    c = core(retry=IN_PROCESS)
    t = c.receive(1)
    assert c.shutdown.start(t) is None
    c.shutdown.stop()
    out = c.handled([t], exc=ValueError("boom"))
    assert out.run == ()
    given_back(c, out.actions, 1, 2)  # attempt 1 ran: it comes back as attempt 2
    assert c.shutdown.quiescent


def test_a_retry_waiting_when_the_stop_comes_is_released() -> None:
    c = core(retry=IN_PROCESS)
    t = c.receive(1)
    out = c.handled([t], exc=ValueError("boom"))
    assert out.run == (t,) and out.delay > 0 and out.actions == []
    go = c.resume(out.run)  # the wait ended normally: run it again
    assert go.run == (t,) and go.actions == []
    out = c.handled([t], exc=ValueError("boom again"))
    assert out.run == (t,)
    c.shutdown.stop()  # the stop cut the wait short
    go = c.resume(out.run)
    assert go.run == ()
    given_back(c, go.actions, 1, 3)  # attempts 1 and 2 ran


def test_transacted_in_process_retry_runs_again_then_releases_at_stop() -> None:
    c = core(mode=AckMode.TRANSACTED, retry=IN_PROCESS)
    t = c.receive(1)
    out = c.handled([t], exc=ValueError("boom"))
    assert out.run == (t,)  # the failed delivery is run again, not left unacked
    c.shutdown.stop()
    go = c.resume(out.run)
    assert go.run == ()
    given_back(c, go.actions, 1, 2)


def test_a_handler_cancelled_at_shutdown_goes_back_with_its_attempt_counted() -> None:
    c = core()
    t = c.receive(1)
    assert c.shutdown.start(t) is None
    c.shutdown.stop()
    assert c.shutdown.release(t, started=True) == [Nack(1, requeue=True)]


def test_quiescent_waits_for_copies_awaiting_confirm() -> None:
    c = core(retry=Retry(max_attempts=1))
    t = c.receive(1)
    (copy,) = c.handled([t], exc=ValueError("to the DLQ")).actions
    assert isinstance(copy, Republish)
    c.shutdown.stop()
    assert not c.shutdown.quiescent  # the dead-letter copy is not confirmed yet
    assert c.republished(copy.token, True) == [Ack(1, multiple=False)]  # the original
    assert c.shutdown.quiescent  # acked with the confirm: nothing left to wait for


def test_a_closed_channel_leaves_nothing_to_wait_for() -> None:
    c = core(retry=Retry(max_attempts=1))
    t = c.receive(1)
    c.handled([t], exc=ValueError("to the DLQ"))
    c.shutdown.stop()
    assert not c.shutdown.quiescent
    c.channel_closed()  # the broker requeued the original: its copy's confirm settles nothing
    assert c.shutdown.quiescent


@given(
    st.lists(st.sampled_from(["ok", "fail", "unstarted"]), min_size=1, max_size=30),
    st.integers(min_value=0, max_value=30),
    st.sampled_from([AckMode.AUTO, AckMode.TRANSACTED, AckMode.DUPS_OK]),
)
def test_every_delivery_is_settled_once_whenever_the_stop_comes(
    fates: list[str], stop_at: int, mode: AckMode
) -> None:
    """Whatever the order of handlers and the stop, each tag is settled exactly once and
    the core ends quiescent: nothing lost, nothing looping, nothing stuck."""
    c = core(mode=mode, retry=IN_PROCESS, prefetch=0)
    ts = [c.receive(i + 1) for i in range(len(fates))]
    settled: list[int] = []
    reruns = []

    def take(acts: list[Any]) -> None:
        for a in acts:
            if isinstance(a, Republish):  # a copy of one returned unstarted: confirmed
                take(c.republished(a.token, True))
            elif isinstance(a, Ack) and a.multiple:
                settled.extend(x for x in range(1, a.tag + 1) if x not in settled)
            elif isinstance(a, (Ack, Nack)):
                settled.append(a.tag)

    for i, (t, fate) in enumerate(zip(ts, fates, strict=True)):
        if i == stop_at:
            take(c.shutdown.stop())
        acts = c.shutdown.start(t)
        if acts is not None:
            take(acts)
            continue
        if fate == "unstarted":
            continue
        out = c.handled([t], exc=None if fate == "ok" else ValueError("x"))
        take(out.actions)
        reruns.extend(out.run)
    if not c.shutdown.stopping:
        take(c.shutdown.stop())
    take(c.resume(tuple(reruns)).actions)
    for t, fate in zip(ts, fates, strict=True):
        if fate == "unstarted" and not t.settled:  # queued at the stop: the workers hand it back
            take(c.shutdown.start(t) or [])
    take(c.drain())
    assert sorted(settled) == list(range(1, len(fates) + 1))
    assert c.shutdown.quiescent and c.shutdown.busy == 0
