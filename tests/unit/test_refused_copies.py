"""A copy the broker refuses never costs its original (the core alone, no broker).

Issue 20: with a max-length / reject-publish policy on the DLQ, 30 of 30 failing
messages were lost: the core's "3 refusals in a row" budget was the listener's,
and after it a refused copy's original was rejected without requeue. Now every
refusal (basic.nack, a return although its queue was just declared, a 403
channel close) returns that message's original to its queue (its redelivery not
an attempt), or runs it when the refused copy was a restamp to its own full
queue; the listener waits (FlowState.REFUSED) instead of spinning; a copy lost
with its channel for another reason is sent again, a bounded number of times per
message; `dead_lettered` counts only copies the broker confirmed.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from ackkit import DeadLetterMessage, Retry
from ackkit._core.actions import Ack, Action, CopyPurpose, Nack, Reject, Republish, Start
from ackkit._core.brokers import V3
from ackkit._core.gate import MAX_REFUSAL_WAIT, REFUSAL_WAIT, Admission
from ackkit._core.listener import MAX_LOST_COPIES, ListenerCore
from ackkit._core.policy import ListenerPolicy
from ackkit._core.republish import refused
from ackkit._core.tracked import Tracked
from ackkit.flow import FlowState
from ackkit.observability import Stage

RETRY3 = Retry(max_attempts=3, initial_interval=0.2)
ACCESS_REFUSED = (
    "ChannelClosedByBroker: (403, \"ACCESS_REFUSED - access to exchange 'amq.default' "
    "in vhost '/' refused for user 'reader'\")"
)
CUT = "ConnectionResetError: the connection was cut"


def core(now: list[float], hold: bool = True, **kw: object) -> ListenerCore:
    policy = ListenerPolicy(name="l", queue="q", retry=RETRY3, queue_type="classic", **kw)  # type: ignore[arg-type]
    c = ListenerCore(
        policy, clock=lambda: now[0], wallclock=lambda: 0.0, broker=V3, hold_early_copies=hold
    )
    c.channel_opened()
    return c


def failed(c: ListenerCore, tag: int, exc: BaseException) -> Republish:
    t = c.receive(tag, message_id=f"m{tag}")
    (a,) = c.finish(t, exc)
    assert isinstance(a, Republish)
    return a


def test_each_refusal_returns_its_own_original_and_the_listener_waits() -> None:
    now = [0.0]
    c = core(now)
    copies = [failed(c, tag, DeadLetterMessage("poison")) for tag in range(1, 31)]
    for a in copies:
        assert c.republished(a.token, False) == [Reject(a.tag, requeue=True)]
    counts = c.counters.counts
    assert counts[Stage.COPY_REFUSED] == 30 and counts[Stage.REJECTED] == 0
    assert counts[Stage.DEAD_LETTERED] == 0  # none reached the DLQ: none counted
    assert c.gating.flow.state is FlowState.REFUSED
    step = c.gating.flow.tick()
    assert step.consume is False  # the runtime cancels the consumer


def test_the_redelivery_of_a_returned_original_is_not_an_attempt() -> None:
    now = [0.0]
    c = core(now)
    a = failed(c, 1, ValueError("x"))  # attempt 1: a retry copy to the delay queue
    assert a.purpose is CopyPurpose.RETRY
    c.republished(a.token, False)
    again = c.receive(2, redelivered=True, message_id="m1")
    assert again.attempt == 1 and again.verdict is None  # no restamp, no attempt used


def test_a_403_channel_close_is_a_refusal_and_its_reason_is_kept() -> None:
    now = [0.0]
    seen: list[str] = []
    c = core(now)
    c._report.observer = lambda ev: seen.append(f"{ev.stage.value}: {ev.reason}")
    a = failed(c, 1, DeadLetterMessage("poison"))
    assert refused(ACCESS_REFUSED)
    assert c.republished(a.token, False, lost=ACCESS_REFUSED) == [Reject(1, requeue=True)]
    assert any(s.startswith("copy_refused") and "ACCESS_REFUSED" in s for s in seen), seen
    assert any(s.startswith("paused") and "ACCESS_REFUSED" in s for s in seen), seen
    assert not any("nacked by the broker" in s for s in seen)


def test_a_copy_lost_with_its_channel_is_sent_again_a_few_times_per_message() -> None:
    now = [0.0]
    c = core(now)
    a = failed(c, 1, DeadLetterMessage("poison"))
    b = failed(c, 2, DeadLetterMessage("poison"))
    for _ in range(MAX_LOST_COPIES):
        (a2,) = c.republished(a.token, False, lost=CUT)
        assert isinstance(a2, Republish) and not a2.minimal and a2.set_headers == a.set_headers
        a = a2
    assert c.gating.flow.state is FlowState.CONSUMING  # a chance loss is no refusal
    assert c.republished(a.token, False, lost=CUT) == [Reject(1, requeue=True)]
    (b2,) = c.republished(b.token, False, lost=CUT)  # message 2 has its own count
    assert isinstance(b2, Republish)
    assert c.republished(b2.token, True) == [Ack(2)]
    assert c.counters.counts[Stage.DEAD_LETTERED] == 1


def test_the_wait_doubles_while_refusals_go_on_and_a_confirm_ends_it() -> None:
    now = [0.0]
    c = core(now)
    waits = []
    for tag in range(1, 19, 2):
        a = failed(c, tag, DeadLetterMessage("poison"))
        c.republished(a.token, False)
        assert c.gating.flow.state is FlowState.REFUSED
        assert c.gating.flow.arrive(c.receive(tag + 1)) is Admission.RETURN
        waits.append(c.gating.flow.refusal_wait)
        c.gating.flow.tick()
        now[0] += c.gating.flow.refusal_wait
        assert c.gating.flow.tick().consume is True and c.gating.flow.state is FlowState.CONSUMING
    assert waits[0] == REFUSAL_WAIT and waits[1] == 2 * REFUSAL_WAIT
    assert max(waits) == MAX_REFUSAL_WAIT
    a = failed(c, 50, DeadLetterMessage("poison"))
    c.republished(a.token, True)
    assert c.gating.flow.refusing == {} and c.gating.flow.refusal_wait == 0
    assert c.counters.counts[Stage.RECOVERED] == 1


def test_a_confirm_while_waiting_resumes_at_once() -> None:
    now = [0.0]
    c = core(now)
    a, b = failed(c, 1, DeadLetterMessage("x")), failed(c, 2, DeadLetterMessage("x"))
    c.republished(a.token, False)
    assert c.gating.flow.state is FlowState.REFUSED
    assert c.republished(b.token, True) == [Ack(2)]  # the queue had room after all
    assert c.gating.flow.state is FlowState.CONSUMING
    assert c.gating.flow.tick().consume is True


def test_a_refused_restamp_runs_its_original_and_pull_mode_requeues_it() -> None:
    now = [0.0]
    c = core(now)
    t = c.receive(1, redelivered=True, message_id="m1")
    assert t.verdict is not None
    (a,) = t.verdict
    assert isinstance(a, Republish) and a.purpose is CopyPurpose.RESTAMP
    assert c.republished(a.token, False) == [Start(t.tag)]
    assert c.gating.flow.state is FlowState.CONSUMING
    pull = core(now, hold=False)
    t = pull.receive(1, redelivered=True, message_id="m1")
    assert t.verdict is not None
    assert pull.republished(t.verdict[0].token, False) == [Reject(1, requeue=True)]  # type: ignore[union-attr]


OUTCOMES = ("ok", "nack", "returned", "refused", "lost")


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.sampled_from(["retry", "dead", "redelivered"]), min_size=1, max_size=12),
    st.lists(
        st.tuples(st.sampled_from([*OUTCOMES, "tick"]), st.integers(0, 50)),
        max_size=80,
    ),
)
def test_any_answers_never_lose_an_original(
    kinds: list[str], answers: list[tuple[str, int]]
) -> None:
    """Any sequence of confirms, nacks, returns, 403 closes and chance losses, per copy, in
    any order, with time passing: every original ends acked after a confirmed copy of it
    (or after its handler ran), or back in its queue; none rejected without requeue, and
    `dead_lettered` counts exactly the confirmed dead-letter copies."""
    now = [0.0]
    c = core(now)
    n = len(kinds)
    open_copies: dict[int, Republish] = {}
    settled: dict[int, str] = {}
    copied: set[int] = set()  # tags with a confirmed copy
    handled: set[int] = set()  # tags whose handler ran after a refused restamp
    dead_confirmed = 0
    received: dict[int, Tracked] = {}  # tag -> the core's record (the runtime's map)

    def carry(acts: list[Action]) -> None:
        for x in acts:
            if isinstance(x, Republish):
                open_copies[x.token] = x
            elif isinstance(x, Start):
                t = received[x.tag]  # the runtime maps the tag to its delivery
                handled.add(t.tag)
                carry(c.finish(t))  # its handler runs and succeeds
            elif isinstance(x, Ack):
                covered = [t for t in range(1, n + 1) if t <= x.tag] if x.multiple else [x.tag]
                for tag in covered:
                    settled.setdefault(tag, "acked")
            else:
                assert isinstance(x, Reject | Nack)
                assert x.requeue, f"original {x.tag} rejected without requeue: lost"
                assert settled.setdefault(x.tag, "requeued") == "requeued"

    for tag, kind in enumerate(kinds, 1):
        if kind == "redelivered":
            t = received[tag] = c.receive(tag, redelivered=True, message_id=f"m{tag}")
            assert t.verdict is not None
            carry(t.verdict)
        else:
            t = c.receive(tag, message_id=f"m{tag}")
            carry(c.finish(t, ValueError("x") if kind == "retry" else DeadLetterMessage("p")))
    for what, i in answers:
        if what == "tick":
            now[0] += i
            c.gating.flow.tick()
            continue
        if not open_copies:
            break
        token = sorted(open_copies)[i % len(open_copies)]
        a = open_copies.pop(token)
        if what == "ok":
            copied.add(a.tag)
            dead_confirmed += a.purpose is CopyPurpose.DEAD_LETTER
        acts = c.republished(
            token,
            what == "ok",
            unroutable=what == "returned",
            lost=ACCESS_REFUSED if what == "refused" else CUT if what == "lost" else None,
        )
        carry(acts)
        if any(isinstance(x, Reject) and x.requeue for x in acts) and a.purpose is not (
            CopyPurpose.RESTAMP
        ):
            assert c.gating.flow.state is FlowState.REFUSED
    while open_copies:  # the broker answers the rest
        token = min(open_copies)
        a = open_copies.pop(token)
        copied.add(a.tag)
        dead_confirmed += a.purpose is CopyPurpose.DEAD_LETTER
        carry(c.republished(token, True))
    carry(c.drain())
    assert sorted(settled) == list(range(1, n + 1)), "an original left unsettled"
    for tag, how in settled.items():
        if how == "acked":
            assert tag in copied or tag in handled, f"{tag} acked without its copy"
    assert c.counters.counts[Stage.DEAD_LETTERED] == dead_confirmed
    assert c.counters.counts[Stage.REJECTED] == 0


def test_a_pause_by_hand_outranks_a_refusal_and_outlives_it() -> None:
    now = [0.0]
    c = core(now)
    a = failed(c, 1, DeadLetterMessage("x"))
    c.republished(a.token, False)
    c.gating.flow.pause()
    assert c.gating.flow.state is FlowState.PAUSED
    now[0] += MAX_REFUSAL_WAIT
    c.gating.flow.tick()  # the refusal's wait is over: still paused by hand
    assert c.gating.flow.state is FlowState.PAUSED and not c.gating.flow.consuming
    c.gating.flow.resume()
    assert c.gating.flow.state is FlowState.CONSUMING


def test_no_ack_listeners_wait_too_and_lose_only_what_the_broker_forgot() -> None:
    """AckMode.NONE: the broker forgot the message on send; a refused dead letter is
    reported lost (as before), and the listener waits instead of consuming more."""
    from ackkit import AckMode

    now = [0.0]
    policy = ListenerPolicy(name="l", queue="q", mode=AckMode.NONE)
    c = ListenerCore(policy, clock=lambda: now[0], broker=V3)
    c.channel_opened()
    t = c.receive(1, message_id="m1")
    (a,) = c.finish(t, ValueError("x"))
    assert isinstance(a, Republish)
    assert c.republished(a.token, False) == []
    assert c.counters.counts[Stage.REJECTED] == 1
    assert c.gating.flow.state is FlowState.REFUSED
