"""Originals: what the core's delivery tags are to an executor (no broker).

The core names deliveries by (generation, tag) only; each executor maps them to its own
objects, and remembers the original of each copy in flight by the copy's token."""

from __future__ import annotations

import pytest

from ackkit._core.actions import Ack, Action, Nack, Reject, Republish
from ackkit._interpreter.originals import KEPT_GENERATIONS, Originals


def filled(gen: int = 1, tags: range = range(1, 6)) -> Originals[str]:
    o: Originals[str] = Originals()
    for tag in tags:
        o.put(gen, tag, f"d{tag}")
    return o


@pytest.mark.parametrize(
    ("frame", "left"),
    [
        (Ack(3), [1, 2, 4, 5]),
        (Ack(3, multiple=True), [4, 5]),
        (Nack(2, multiple=True), [3, 4, 5]),
        (Nack(5, multiple=False), [1, 2, 3, 4]),
        (Reject(1), [2, 3, 4, 5]),
        (Ack(9, multiple=True), []),
    ],
)
def test_a_settle_frame_ends_its_tags(frame: Ack | Nack | Reject, left: list[int]) -> None:
    o = filled()
    o.settled(1, frame)
    assert [t for t in range(1, 6) if o.get(1, t) is not None] == left
    assert len(o) == len(left)


def test_a_frame_of_another_generation_settles_nothing_here() -> None:
    o = filled(gen=2)
    o.settled(1, Ack(5, multiple=True))
    assert len(o) == 5


def test_tags_are_per_generation_and_old_generations_go() -> None:
    o: Originals[str] = Originals()
    o.put(1, 1, "old")
    o.put(2, 1, "new")
    assert (o.get(1, 1), o.get(2, 1)) == ("old", "new")
    o.put(1, 2, "late")  # a late delivery of the previous channel
    assert o.get(1, 2) == "late"
    o.put(1 + KEPT_GENERATIONS, 1, "newest")
    assert o.get(1, 1) is None and o.get(2, 1) == "new"


def test_a_copy_keeps_its_original_until_answered_and_a_resend_the_same_one() -> None:
    o = filled()
    first = Republish(7, 3, "", "q.dlq")
    acts: list[Action] = [first]
    o.decided(1, acts)
    o.settled(1, Ack(5, multiple=True))  # the delivery is done with on its channel
    assert o.copy(7) == "d3"
    again = Republish(8, 3, "", "q.dlq", again_of=7)
    o.decided(1, [again])
    o.answered(7)
    assert (o.copy(7), o.copy(8)) == (None, "d3")
    o.answered(8)
    assert o.copy(8) is None


def test_a_copy_of_a_tag_it_does_not_know_is_not_remembered() -> None:
    o = filled()
    o.decided(1, [Republish(1, 42, "", "q.dlq")])
    assert o.copy(1) is None
