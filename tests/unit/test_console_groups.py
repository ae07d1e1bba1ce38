"""The console's failure groups: what varies between occurrences folds away, nothing else."""

from __future__ import annotations

import re
import time

from hypothesis import given, settings
from hypothesis import strategies as st

from ackkit._core import headers as H
from ackkit.console._groups import MESSAGE_MAX, group_key, normalise
from ackkit.console._store import Store
from ackkit.dead_letters._letter import describe

words = st.text(alphabet=st.characters(categories=["L", "P", "Zs"]), max_size=12).filter(
    lambda w: not re.search(r"['\"\d]", w)
)
"""Message parts without quotes or digits: the fixed text of a message template."""
KINDS = (
    st.one_of(
        st.integers(min_value=-(10**12), max_value=10**12).map(str),
        st.floats(allow_nan=False, allow_infinity=False, min_value=0, max_value=1e6).map(
            lambda f: f"{f:.3f}"
        ),
        st.uuids().map(str),
        st.binary(min_size=4, max_size=16).map(lambda b: "1" + b.hex()),
    ),
    st.text(alphabet=st.characters(exclude_characters="'"), max_size=20).map(lambda t: f"'{t}'"),
    st.text(alphabet=st.characters(exclude_characters='"'), max_size=20).map(lambda t: f'"{t}"'),
)
"""What differs between occurrences of one failure, by the kind of hole it fills:
numbers and ids, single-quoted values, double-quoted values."""


@settings(max_examples=150)
@given(st.text(max_size=300))
def test_normalise_is_idempotent_bounded_and_has_no_digits(message: str) -> None:
    once = normalise(message)
    assert normalise(once) == once
    assert len(once) <= MESSAGE_MAX
    assert not re.search(r"\d", once)


@settings(max_examples=150)
@given(st.lists(words, min_size=2, max_size=5), st.data())
def test_occurrences_of_one_template_fall_into_one_group(
    parts: list[str], data: st.DataObject
) -> None:
    """Filling a template's holes with any numbers, ids or quoted values (the same kind
    in each hole) gives the same normalised message (blanks keep holes and words apart)."""
    kinds = [data.draw(st.sampled_from(KINDS)) for _ in parts[1:]]

    def fill() -> str:
        holes = [data.draw(k) for k in kinds]
        return parts[0] + "".join(f" {v} {p}" for v, p in zip(holes, parts[1:], strict=True))

    assert normalise(fill()) == normalise(fill())


@settings(max_examples=100)
@given(words.filter(lambda w: w.strip() != ""), words.filter(lambda w: w.strip() != ""))
def test_different_fixed_text_stays_apart(a: str, b: str) -> None:
    """Folding never merges messages whose fixed words differ."""
    if " ".join(a.split()) != " ".join(b.split()):
        assert normalise(f"{a} 42") != normalise(f"{b} 42")


def test_examples() -> None:
    assert normalise("order 1234 not found ('abc')") == "order # not found ('…')"
    assert normalise("order 99 not found ('x')") == "order # not found ('…')"
    assert normalise("user 5f0c2a1e-8d3b-4c1a-9e2f-0b1c2d3e4f50 gone") == "user # gone"
    assert normalise("blob deadbeef12 at 0x7f00aa11") == "blob # at #"
    assert normalise("timeout after 2.5s") == "timeout after #s"
    assert normalise("  many \n  blanks ") == "many blanks"


def dead_letter(listener: str, error: str, message: str, replayed: int = 0) -> object:
    h = {
        H.REASON: "attempts exhausted (3 of 3)",
        H.ERROR_TYPE: error,
        H.ERROR_MESSAGE: message,
        H.LISTENER: listener,
        H.ORIGINAL_QUEUE: "orders",
        H.DEAD_LETTERED_AT: "2026-11-26T06:00:00+00:00",
    }
    if replayed:
        h[H.REPLAYED] = replayed
    return describe(h, message_id="m")


def test_group_key_is_listener_error_type_and_folded_message() -> None:
    a = group_key("orders.dlq", dead_letter("orders", "KeyError", "'sku-1'"))
    b = group_key("orders.dlq", dead_letter("orders", "KeyError", "'sku-2'"))
    c = group_key("orders.dlq", dead_letter("orders", "ValueError", "'sku-2'"))
    d = group_key("orders.dlq", dead_letter("billing", "KeyError", "'sku-2'"))
    assert a == b and a.id == b.id
    assert len({a.id, c.id, d.id}) == 3
    broker = describe({"x-death": [{"reason": "expired", "queue": "q", "count": 1}]})
    assert group_key("q.dlq", broker).error_type == "(broker)"
    assert group_key("q.dlq", broker).message == "expired"


def test_store_groups_counts_first_last_and_came_back() -> None:
    store = Store(["orders.dlq"])
    dls = [dead_letter("orders", "KeyError", f"'sku-{i}'", replayed=i % 2) for i in range(6)]
    added = []
    for n, dl in enumerate(dls):
        key = group_key("orders.dlq", dl)  # type: ignore[arg-type]
        added.append(store.add("orders.dlq", 0, 1, None, dl, None, b"", key, received=time.time()))  # type: ignore[arg-type]
        added[-1].at = 1000.0 + n  # spread the failure times
    (g,) = store.groups()
    assert (g.count, g.came_back) == (6, 3)
    store.remove([added[0].id, added[1].id])
    (g,) = store.groups()
    assert g.count == 4 and g.came_back == 2
    # claims: a second action gets nothing the first one holds
    ids = store.group_ids(g.id)
    first = store.claim(ids[:3])
    second = store.claim(ids)
    assert [e.id for e in first] == ids[:3] and [e.id for e in second] == ids[3:]
    store.release(first)
    assert [e.id for e in store.claim(ids)] == ids[:3]


@settings(max_examples=100)
@given(
    st.dictionaries(
        st.integers(min_value=1_700_000_000, max_value=1_800_000_000),
        st.integers(min_value=1, max_value=1000),
        min_size=1,
        max_size=50,
    )
)
def test_chart_keeps_every_failure_in_at_most_48_bars(seconds: dict[int, int]) -> None:
    from ackkit.console._render import chart

    step, bars = chart(seconds)
    assert sum(b.count for b in bars) == sum(seconds.values())
    assert 1 <= len(bars) <= 48 and step
    assert max(b.height for b in bars) == 60.0
