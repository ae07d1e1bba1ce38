"""Property tests: no completion order makes a multiple-ack cover an unsettled tag."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from ackkit._core.actions import Ack, Nack, Reject, Republish
from ackkit._core.listener import ListenerCore
from ackkit._core.policy import FlushPolicy, ListenerPolicy

N = 40


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


class BrokerModel:
    """What the broker knows: outstanding tags. Any settle of an unknown tag is an error."""

    def __init__(self) -> None:
        self.outstanding: set[int] = set()
        self.acked: set[int] = set()
        self.requeued: set[int] = set()

    def deliver(self, tag: int) -> None:
        self.outstanding.add(tag)

    def apply(self, acts: list, finished: set[int]) -> None:
        for a in acts:
            if isinstance(a, Ack):
                covered = {t for t in self.outstanding if t <= a.tag} if a.multiple else {a.tag}
                assert a.tag in self.outstanding, f"ack of unknown tag {a.tag}"
                unsettled = covered - finished
                assert not unsettled, f"ack {a} covers unsettled tags {sorted(unsettled)}"
                self.outstanding -= covered
                self.acked |= covered
            elif isinstance(a, (Reject, Nack)):
                assert a.tag in self.outstanding, f"{a} of unknown tag"
                self.outstanding.discard(a.tag)
                if a.requeue:
                    self.requeued.add(a.tag)
            elif isinstance(a, Republish):
                pass


@settings(max_examples=300, deadline=None)
@given(
    order=st.permutations(list(range(1, N + 1))),
    failing=st.sets(st.integers(1, N), max_size=8),
    max_pending=st.integers(1, 30),
    ticks=st.lists(st.integers(0, N), max_size=6),
)
def test_multiple_ack_only_covers_settled_prefix(order, failing, max_pending, ticks):
    clock = Clock()
    core = ListenerCore(
        ListenerPolicy(
            name="p",
            queue="q",
            prefetch=N,
            flush=FlushPolicy(max_pending=max_pending, interval=0.1),
        ),
        clock=clock,
        wallclock=lambda: 0.0,
    )
    core.channel_opened()
    broker = BrokerModel()
    tracked = {}
    for tag in range(1, N + 1):
        broker.deliver(tag)
        tracked[tag] = core.receive(tag)
    finished: set[int] = set()
    pending_tokens: list[int] = []
    for i, tag in enumerate(order):
        finished.add(tag)
        exc = ValueError("x") if tag in failing else None
        acts = core.finish(tracked[tag], exc)
        pending_tokens += [a.token for a in acts if isinstance(a, Republish)]
        broker.apply(acts, finished)
        if i in ticks:
            clock.t += 1.0
            broker.apply(core.tick(), finished)
    for tok in pending_tokens:
        broker.apply(core.republished(tok, True), finished)
    broker.apply(core.drain(), finished)
    # Everything ends settled: acked (incl. dead-lettered originals), nothing outstanding.
    assert broker.outstanding == set()
    assert broker.acked == set(range(1, N + 1))
    assert core.gauges().pending_acks == 0


@settings(max_examples=200, deadline=None)
@given(
    order=st.permutations(list(range(1, 21))),
    close_at=st.integers(0, 19),
)
def test_no_action_after_channel_closed_reaches_new_generation(order, close_at):
    core = ListenerCore(ListenerPolicy(name="p", queue="q", prefetch=20), wallclock=lambda: 0.0)
    core.channel_opened()
    old = {tag: core.receive(tag) for tag in range(1, 21)}
    for i, tag in enumerate(order):
        if i == close_at:
            core.channel_closed()
            core.channel_opened()
            core.receive(1)  # tag 1 again, on the new channel
        acts = core.finish(old[tag])
        if i >= close_at:
            assert acts == [], "a stale delivery produced an action on the new channel"
