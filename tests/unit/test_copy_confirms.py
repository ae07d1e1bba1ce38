"""A confirmed copy settles its original at once, and any interleaving of finishes,
confirms and flushes leaves valid frames, without a broker."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from ackkit import AckMode, FlushPolicy
from ackkit._core.actions import Ack, Republish
from tests.unit._fakes import RETRY3, Broker, core


def test_confirmed_copy_acks_the_original_at_once() -> None:
    c = core(retry=RETRY3, prefetch=100)
    ts = [c.receive(n) for n in (1, 2, 3)]
    assert c.finish(ts[1]) == []  # batched
    [a] = c.finish(ts[0], ValueError("x"))
    assert isinstance(a, Republish)
    # 1 and 2 form the settled prefix now: one multiple-ack, no waiting for the flush
    assert c.republished(a.token, True) == [Ack(2, multiple=True)]
    [b] = c.finish(ts[2], ValueError("y"))
    assert c.republished(b.token, True) == [Ack(3)]
    assert c.drain() == []


def test_confirmed_copy_behind_a_running_handler_is_acked_alone() -> None:
    c = core(retry=RETRY3, prefetch=100)
    ts = [c.receive(n) for n in (1, 2, 3)]
    [a] = c.finish(ts[1], ValueError("x"))
    assert c.republished(a.token, True) == [Ack(2)]  # 1 still in its handler
    assert c.finish(ts[0]) == [] and c.finish(ts[2]) == []
    assert c.drain() == [Ack(3, multiple=True)]


def test_transacted_keeps_the_ack_in_the_transaction() -> None:
    c = core(retry=RETRY3, mode=AckMode.TRANSACTED, prefetch=100)
    t = c.receive(1)
    [a] = c.finish(t, ValueError("x"))
    assert c.republished(a.token, True) == []


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 3), st.integers(0, 39)), min_size=1, max_size=120),
    st.integers(1, 12),
)
def test_any_interleaving_of_finishes_confirms_and_flushes_is_valid(
    ops: list[tuple[int, int]], max_pending: int
) -> None:
    """In decision order, every frame names an outstanding tag and every delivery ends
    settled exactly once (acks: handled or copied; requeues: refused copies)."""
    n = 40
    c = core(
        retry=RETRY3,
        prefetch=100,
        flush=FlushPolicy(max_pending=max_pending, interval=0.0),
    )
    broker = Broker(range(1, n + 1))
    ts = [c.receive(tag) for tag in range(1, n + 1)]
    tokens: list[int] = []
    for op, i in ops:
        if op == 0 and not ts[i].settled:
            broker.apply(c.finish(ts[i]))
        elif op == 1 and not ts[i].settled:
            acts = c.finish(ts[i], ValueError("x"))
            tokens += [a.token for a in acts if isinstance(a, Republish)]
            broker.apply(acts)
        elif op == 2 and tokens:
            broker.apply(c.republished(tokens.pop(i % len(tokens)), i % 5 != 0))
        else:
            broker.apply(c.tick())
    for t in ts:
        if not t.settled:
            broker.apply(c.finish(t))
    for tok in tokens:
        broker.apply(c.republished(tok, True))
    broker.apply(c.drain())
    assert broker.outstanding == set()
    assert sorted(broker.acked + broker.requeued) == list(range(1, n + 1))
