"""An inbox listener's crash-loop bound counts only runs lost before their commit: a
redelivery whose key the inbox recorded is a duplicate (acked), never dead-lettered as
a crash loop or as exhausted; one whose key is not recorded is bounded as before. The
core decides (`look_up_first`, `start`); the runtime only looks the key up."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from ackkit import AckMode, Retry
from ackkit._core import headers as H
from ackkit._core.actions import Ack, Action, CopyPurpose, Republish
from ackkit._core.events import Stage
from ackkit._core.listener import ListenerCore
from ackkit._core.policy import ListenerPolicy


def core(dedup: bool = True, **kw: Any) -> ListenerCore:
    kw.setdefault("name", "l")
    kw.setdefault("queue", "q")
    c = ListenerCore(ListenerPolicy(**kw), wallclock=lambda: 0.0, dedup=dedup)
    c.channel_opened()
    return c


def purposes(acts: list[Action] | None) -> list[str]:
    return [a.purpose.value for a in acts or [] if isinstance(a, Republish)]


def test_past_the_bound_a_recorded_key_is_a_duplicate_acked_not_dead_lettered() -> None:
    c = core()
    t = c.receive(1, redelivered=True, headers={H.LOST: H.LOST_BOUND}, message_id="m")
    assert t.verdict is None and c.lost.look_up_first(t)
    c.lost.duplicate(t, "m")  # the runtime found the key recorded
    acts = c.handled([t]).actions + c.drain()
    assert acts == [Ack(1, multiple=False)]
    counts = c.counters.counts
    assert counts[Stage.DUPLICATE] == 1 and counts[Stage.DEAD_LETTERED] == 0
    assert not c._confirms  # no copy anywhere: neither a dead letter nor a charged run


def test_past_the_bound_an_unrecorded_key_is_dead_lettered_at_start() -> None:
    c = core()
    t = c.receive(1, redelivered=True, headers={H.LOST: H.LOST_BOUND}, message_id="m")
    assert c.lost.look_up_first(t)
    (dead,) = c.shutdown.start(t) or []
    assert isinstance(dead, Republish) and dead.purpose is CopyPurpose.DEAD_LETTER
    assert dead.set_headers[H.REASON] == (
        f"consumer died or lost its connection {H.LOST_BOUND} times while handling it"
    )


def test_under_the_bound_a_recorded_key_is_never_charged() -> None:
    c = core()
    t = c.receive(1, redelivered=True, headers={H.LOST: 1}, message_id="m")
    assert t.lost == 1 and c.lost.look_up_first(t)
    c.lost.duplicate(t, "m")
    assert purposes(c.handled([t]).actions) == []
    t2 = c.receive(2, redelivered=True, headers={H.LOST: 1}, message_id="n")
    assert purposes(c.shutdown.start(t2)) == ["restamp"]  # not recorded: charged as before


def test_attempts_exhausted_defer_to_the_record_too() -> None:
    c = core(retry=Retry(max_attempts=3))
    t = c.receive(1, redelivered=True, headers={H.ATTEMPT: 3}, message_id="m")
    assert t.verdict is None and c.lost.look_up_first(t)
    c.lost.duplicate(t, "m")
    assert c.handled([t]).actions + c.drain() == [Ack(1, multiple=False)]
    t = c.receive(2, redelivered=True, headers={H.ATTEMPT: 3}, message_id="n")
    (dead,) = c.shutdown.start(t) or []
    assert isinstance(dead, Republish) and dead.purpose is CopyPurpose.DEAD_LETTER
    assert dead.set_headers[H.REASON] == "attempts exhausted (3 of 3, last one lost)"
    assert dead.set_headers[H.ATTEMPTS] == 3


def test_a_first_delivery_or_a_listener_without_an_inbox_looks_nothing_up() -> None:
    c = core()
    t = c.receive(1, redelivered=False, headers={H.LOST: H.LOST_BOUND}, message_id="m")
    assert not c.lost.look_up_first(t)  # the handler's own claim finds a duplicate
    plain = core(dedup=False)
    t = plain.receive(1, redelivered=True, headers={H.LOST: H.LOST_BOUND}, message_id="m")
    assert not plain.lost.look_up_first(t) and purposes(t.verdict) == ["dead-letter"]


def test_a_stop_returns_a_doomed_delivery_unchanged() -> None:
    c = core()
    t = c.receive(1, redelivered=True, headers={H.LOST: H.LOST_BOUND}, message_id="m")
    c.shutdown.stop()
    (copy,) = c.shutdown.start(t) or []
    assert isinstance(copy, Republish) and copy.purpose is CopyPurpose.RESTAMP
    assert H.LOST not in copy.set_headers  # the count kept as it was


@settings(max_examples=400, deadline=None)
@given(
    st.lists(st.sampled_from(["run lost", "prefetch lost", "commit lost"]), max_size=40),
    st.booleans(),
)
def test_only_runs_lost_before_their_commit_count(events: list[str], twin: bool) -> None:
    """One message through a model broker and a model inbox: each event is what ends one
    delivery of it (the process dies while its handler runs uncommitted; before it
    started; after its transaction committed, or after a duplicate run, the ack not
    out). Once its key is recorded it is never dead-lettered nor charged, however often
    its consumers die around it: every run is a duplicate, acked. Before
    that, it is dead-lettered only after at least LOST_BOUND charged runs were lost,
    and at the latest at the delivery after LOST_BOUND + 1 lost runs. `twin`: its key
    was recorded by a twin (the same key published twice) before it arrived."""
    headers: dict[str, Any] = {}
    redelivered = False
    recorded = twin
    c = core(mode=AckMode.AUTO)
    tag = 0
    lost_runs = charged_lost = 0
    for event in [*events, "end"]:
        tag += 1
        t = c.receive(tag, redelivered, dict(headers), message_id="m")
        assert t.verdict is None  # nothing is decided before the look-up
        if event == "prefetch lost":
            c, redelivered = core(mode=AckMode.AUTO), True
            continue
        if c.lost.look_up_first(t) and recorded:  # the runtime's look-up found the key
            c.lost.duplicate(t, "m")
            assert purposes(c.handled([t]).actions) == []
            if event == "end":
                return
            c, redelivered = core(mode=AckMode.AUTO), True  # its ack was lost too
            continue
        acts = c.shutdown.start(t)
        if purposes(acts) == ["dead-letter"]:
            assert not recorded
            assert charged_lost >= H.LOST_BOUND
            return
        assert lost_runs <= H.LOST_BOUND
        charged = bool(acts)
        assert not (charged and recorded)
        if acts:  # the handler runs on a charged copy: it replaces the message
            (copy,) = acts
            assert isinstance(copy, Republish) and copy.purpose is CopyPurpose.RESTAMP
            headers.update({k: v for k, v in copy.set_headers.items() if v is not None})
            c.republished(copy.token, True)
            tag += 1
            t = c.receive(tag, False, dict(headers), message_id="m")
            assert not c.lost.look_up_first(t) and c.shutdown.start(t) is None
        if recorded or event == "end":  # the handler's claim: a duplicate, or it commits
            assert purposes(c.handled([t]).actions) == []
            if event == "end":
                return
        elif event == "commit lost":
            recorded = True
        else:
            lost_runs += 1
            charged_lost += charged
        c, redelivered = core(mode=AckMode.AUTO), True
