"""The sync runtime's hand-off between the I/O thread and the handler threads
(`ackkit._sync.handoff`): whatever the order of arrivals, hand-overs, takes, stops and
give-backs, every delivery is taken or drained exactly once, in arrival order, and
a burst waits for its hand-over (one wake-up per socket read)."""

from __future__ import annotations

import queue
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ackkit._sync.handoff import Handoff


def _handoff(per_burst: bool = True) -> tuple[Handoff[int], list[object]]:
    later: list[object] = []
    return Handoff(threading.Lock(), per_burst=per_burst), later


def test_a_burst_waits_for_its_hand_over_and_is_handed_over_once() -> None:
    h, later = _handoff()
    for d in (1, 2, 3):
        h.arrive(d, later.append)
    assert len(later) == 1  # one hand-over scheduled for the read
    with pytest.raises(queue.Empty):
        h.take(timeout=0.01)
    later[0]()  # type: ignore[operator]
    assert [h.take(timeout=0), h.take(timeout=0), h.take(timeout=0)] == [1, 2, 3]
    with pytest.raises(queue.Empty):
        h.take(timeout=0.01)


def test_without_bursts_each_delivery_is_ready_at_once() -> None:
    h, later = _handoff(per_burst=False)
    h.arrive(1, later.append)
    assert later == []
    assert h.take(timeout=0) == 1


def test_a_stop_drains_the_burst_not_yet_handed_over() -> None:
    h, later = _handoff()
    h.put(0)
    h.arrive(1, later.append)
    h.arrive(2, later.append)
    assert h.drain() == [0, 1, 2]
    later[0]()  # type: ignore[operator]  # the hand-over that comes after finds nothing
    h.close(1)
    assert h.take() is None


def test_a_handler_thread_waiting_is_woken_by_the_hand_over() -> None:
    h, later = _handoff()
    got: list[int | None] = []
    th = threading.Thread(target=lambda: got.extend([h.take(), h.take(), h.take()]))
    th.start()
    h.arrive(1, later.append)
    h.arrive(2, later.append)
    later[0]()  # type: ignore[operator]
    h.close(1)
    th.join(10)
    assert got == [1, 2, None]


ops = st.lists(
    st.one_of(
        st.just(("arrive",)),
        st.just(("hand_over",)),
        st.just(("put",)),
        st.just(("take",)),
        st.tuples(st.just("withdraw"), st.sets(st.integers(0, 50))),
    ),
    max_size=60,
)


@settings(max_examples=300)
@given(ops)
def test_every_delivery_is_taken_or_drained_once_in_order(script: list[tuple]) -> None:
    """A model of the I/O thread and one handler thread in any interleaving: nothing
    lost, nothing twice, the order of arrival kept (a withdrawal gives back some of
    what waits and keeps the rest in its place)."""
    h, later = _handoff()
    n = 0
    taken: list[int] = []
    given_back: set[int] = set()
    arrived: set[int] = set()  # off the socket (the rest: held deliveries started later)
    for op in script:
        kind = op[0]
        if kind == "arrive":
            h.arrive(n, later.append)
            arrived.add(n)
            n += 1
        elif kind == "put":  # a held delivery starts: ready at once
            h.put(n)
            n += 1
        elif kind == "hand_over":
            while later:
                later.pop(0)()  # type: ignore[operator]
        elif kind == "take":
            try:
                d = h.take(timeout=0)
            except queue.Empty:
                continue
            assert d is not None
            taken.append(d)
        else:  # cancel: what waits is drained, some given back, the rest put back
            waiting = h.drain()
            out = op[1]
            given_back |= {d for d in waiting if d in out}
            h.put_back([d for d in waiting if d not in out])
    left = h.drain()
    seen = taken + sorted(given_back) + left
    assert sorted(seen) == list(range(n))  # each once
    # off the socket, they are taken (or left) in the order they arrived
    order = [d for d in taken + left if d in arrived and d not in given_back]
    assert order == sorted(order)
