"""Pull mode: one channel, one core per queue. No frame may settle another queue's delivery.

The broker applies a multiple frame to every outstanding tag of the channel up to
its tag, whichever queue the delivery came from. A core only knows its own
queue's deliveries, so the tags it never saw must never be under such a frame.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from ackkit._core.actions import Ack, Action, Nack, Reject, Republish
from ackkit._core.listener import ListenerCore, Tracked
from ackkit._core.policy import FlushPolicy, ListenerPolicy

ACK, REQUEUE, DROP = "ack", "requeue", "drop"


def pull_core(queue: str, dead_letter: str | None) -> ListenerCore:
    """The core a pull connection makes for one queue (see PullConnection._queue)."""
    policy = ListenerPolicy.pull(queue, dead_letter)
    core = ListenerCore(policy, wallclock=lambda: 0.0, shared_channel=True)
    core.channel_opened()
    return core


class Channel:
    """The broker's view of one channel shared by every queue's gets."""

    def __init__(self) -> None:
        self.next_tag = 0
        self.outstanding: dict[int, str] = {}  # tag -> queue
        self.intent: dict[int, str] = {}  # what the caller asked for, per tag
        self.outcome: dict[int, str] = {}  # what the broker did
        self.copies: dict[tuple[str, int], Republish] = {}  # (queue, token): awaiting confirm

    def get(self, queue: str) -> int:
        self.next_tag += 1
        self.outstanding[self.next_tag] = queue
        return self.next_tag

    def apply(self, acts: list[Action]) -> None:
        for a in acts:
            if isinstance(a, Republish):
                assert self.intent.get(a.tag) == DROP, f"copy of {a.tag}, not dead-lettered"
                self.copies[self.outstanding[a.tag], a.token] = a
                continue
            assert isinstance(a, Ack | Nack | Reject), a
            assert a.tag in self.outstanding, f"{a}: unknown delivery tag (channel closes)"
            many = isinstance(a, Ack | Nack) and a.multiple
            done = [t for t in self.outstanding if t <= a.tag] if many else [a.tag]
            what = ACK if isinstance(a, Ack) else REQUEUE if a.requeue else DROP
            for t in done:
                asked = self.intent.get(t)
                assert asked is not None, f"{a} settled tag {t} ({self.outstanding[t]}), unsettled"
                if asked == DROP:  # dead-lettered: its copy first, then the original acked
                    assert what in (ACK, DROP), f"{a} requeued dead-lettered tag {t}"
                else:
                    assert what == asked, f"{a} did {what} to tag {t}; the caller asked {asked}"
                del self.outstanding[t]
                self.outcome[t] = asked


SETTLE = st.tuples(
    st.sampled_from(["ack", "nack", "reject"]),
    st.booleans(),  # requeue
    st.booleans(),  # multiple
)
STEP = st.one_of(
    st.tuples(st.just("get"), st.integers(0, 2)),
    st.tuples(st.just("get"), st.integers(0, 2)),
    st.tuples(st.just("settle"), st.integers(0, 4), SETTLE),  # 0: the newest delivery held
    st.tuples(st.just("confirm"), st.integers(0, 4)),
)


@settings(max_examples=400, deadline=None)
@given(
    n_queues=st.integers(2, 3),
    dead_letter=st.lists(st.booleans(), min_size=3, max_size=3),
    steps=st.lists(STEP, max_size=60),
    final=st.lists(SETTLE, min_size=1, max_size=5),
)
def test_no_frame_settles_a_delivery_the_caller_did_not(n_queues, dead_letter, steps, final):
    ch = Channel()
    queues = [f"q{i}" for i in range(n_queues)]
    cores = {
        q: pull_core(q, f"{q}.dlq" if dl else None)
        for q, dl in zip(queues, dead_letter, strict=False)
    }
    held: list[tuple[str, Tracked]] = []  # the caller's unsettled deliveries, oldest first

    def settle(i: int, how: tuple[str, bool, bool]) -> None:
        kind, requeue, multiple = how
        if kind == "reject":
            multiple = False  # basic.reject has no multiple (Delivery.reject takes none)
        q, t = held[i]
        # CLIENT-like: multiple means this and every earlier unsettled delivery of q.
        mine = [(q2, x) for q2, x in held if q2 == q and x.tag <= t.tag] if multiple else [(q, t)]
        want = ACK if kind == "ack" else REQUEUE if requeue else DROP
        for pair in mine:
            ch.intent[pair[1].tag] = want
            held.remove(pair)
        ch.apply(cores[q].settle(t, kind, requeue=requeue, multiple=multiple))

    def confirm(i: int) -> None:
        q, token = sorted(ch.copies)[i % len(ch.copies)]
        del ch.copies[q, token]
        ch.apply(cores[q].republished(token, True))

    for step in steps:
        if step[0] == "get":
            q = queues[step[1] % n_queues]
            t = cores[q].receive(ch.get(q))
            assert t.verdict is None
            held.append((q, t))
        elif step[0] == "settle" and held:
            settle(len(held) - 1 - step[1] % len(held), step[2])
        elif step[0] == "confirm" and ch.copies:
            confirm(step[1])
    # The caller settles what it still holds, then every copy is confirmed.
    i = 0
    while held:
        settle(0, final[i % len(final)])
        i += 1
    while ch.copies:
        confirm(0)
    assert ch.outstanding == {}, "deliveries left unsettled at the broker"
    assert ch.outcome == ch.intent
    for core in cores.values():
        assert core.gauges().pending_acks == 0
        assert core.gauges().outstanding == 0


def test_ack_multiple_of_one_queue_leaves_the_other_queues_delivery():
    """The case found: queue A holds tags 1 and 3, queue B holds tag 2."""
    ch = Channel()
    a, b = pull_core("a", "a.dlq"), pull_core("b", "b.dlq")
    a1 = a.receive(ch.get("a"))
    b2 = b.receive(ch.get("b"))
    a3 = a.receive(ch.get("a"))
    ch.intent.update({1: ACK, 3: ACK})
    acts = a.settle(a3, "ack", multiple=True)
    assert acts == [Ack(1), Ack(3)]
    ch.apply(acts)
    assert set(ch.outstanding) == {2}
    ch.intent[2] = REQUEUE
    ch.apply(b.settle(b2, "reject", requeue=True))
    assert ch.outcome == {1: ACK, 2: REQUEUE, 3: ACK}
    assert a1.settled and a3.settled


def test_nack_multiple_of_one_queue_leaves_the_other_queues_delivery():
    ch = Channel()
    a, b = pull_core("a", "a.dlq"), pull_core("b", "b.dlq")
    b1 = b.receive(ch.get("b"))
    a.receive(ch.get("a"))
    a3 = a.receive(ch.get("a"))
    ch.intent.update({2: REQUEUE, 3: REQUEUE})
    acts = a.settle(a3, "nack", requeue=True, multiple=True)
    assert acts == [Nack(2), Nack(3)]
    ch.apply(acts)
    ch.intent[1] = ACK
    ch.apply(b.settle(b1, "ack"))
    assert ch.outcome == {1: ACK, 2: REQUEUE, 3: REQUEUE}


def test_own_run_below_the_first_foreign_tag_still_goes_in_one_frame():
    """Tags below every tag delivered elsewhere may share one multiple frame."""
    ch = Channel()
    a, b = pull_core("a", None), pull_core("b", None)
    a1, a2 = a.receive(ch.get("a")), a.receive(ch.get("a"))
    b.receive(ch.get("b"))
    a.receive(ch.get("a"))
    ch.intent.update({1: ACK, 2: ACK})
    acts = a.settle(a2, "ack", multiple=True)
    assert acts == [Ack(2, multiple=True)]
    ch.apply(acts)
    assert a1.settled and set(ch.outstanding) == {3, 4}


def test_a_core_alone_on_its_channel_still_covers_gaps():
    """Consumer mode (the default): unchanged, a gap is nothing outstanding."""
    c = ListenerCore(
        ListenerPolicy(
            name="l", queue="q", prefetch=4, flush=FlushPolicy(max_pending=4, interval=1.0)
        ),
        wallclock=lambda: 0.0,
    )
    c.channel_opened()
    ts = [c.receive(t) for t in (5, 6, 8)]
    acts: list[Action] = []
    for t in ts:
        acts += c.settle(t, "ack") if t.tag != 8 else c.settle(t, "ack", multiple=True)
    assert acts == [Ack(8, multiple=True)]
