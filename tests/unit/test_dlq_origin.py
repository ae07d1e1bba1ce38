"""A dead letter whose broker records name a usable origin queue is replayable, whatever
garbage sits next to that name (other x-death fields, other entries, ackkit headers)."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from ackkit._core import headers as H
from ackkit.dead_letters._letter import describe, replay_target
from tests.unit.test_dlq_headers import values

names = st.text(
    alphabet=st.characters(codec="ascii", categories=["L", "N"]), min_size=1, max_size=40
)
not_names = st.one_of(
    st.integers(), st.binary(min_size=1).filter(lambda b: b[:1] == b"\xff"), st.lists(values)
)
garbage_fields = st.dictionaries(
    st.sampled_from(["exchange", "reason", "routing-keys", "time", "count", "original-expiration"]),
    values,
)


@settings(max_examples=300, deadline=None)
@given(
    queue=names,
    junk=garbage_fields,
    before=st.lists(
        st.one_of(values, garbage_fields, garbage_fields.map(lambda d: {**d, "queue": 5})),
        max_size=3,
    ),
    ours=st.one_of(
        st.just({}),
        st.fixed_dictionaries({H.REASON: values}, optional={H.ORIGINAL_QUEUE: not_names}),
    ),
)
def test_a_usable_origin_is_found_past_garbage(
    queue: str, junk: dict[str, Any], before: list[Any], ours: dict[str, Any]
) -> None:
    d = describe({**ours, "x-death": [*before, {**junk, "queue": queue}]})
    assert d.original_queue == queue
    assert replay_target(d) == queue


def test_the_issues_example() -> None:
    d = describe({"x-death": [{"queue": "orders", "routing-keys": 5}]})
    assert (d.original_queue, d.original_routing_key) == ("orders", None)
    assert d.notes == ("x-death routing-keys: expected a list, got 5",)


def test_ackkits_own_origin_wins_and_the_last_death_queue_is_a_fallback() -> None:
    h = {H.REASON: "x", H.ORIGINAL_QUEUE: "mine", "x-death": [{"queue": "theirs"}]}
    assert describe(h).original_queue == "mine"
    assert (
        describe({"x-last-death-queue": "q2", "x-first-death-queue": "q1"}).original_queue == "q2"
    )
    assert describe({"x-death": 5, "x-first-death-queue": "q1"}).original_queue == "q1"
