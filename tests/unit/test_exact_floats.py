"""wire.exact_floats: headers as pika decoded them (a float or double read as an int,
2.5 as 2, at any depth), given back with the values of the wire, floats as floats; the
other values untouched. Generated headers, encoded as a producer would send them."""

from __future__ import annotations

import math
from typing import Any

import pika.data
from hypothesis import given
from hypothesis import strategies as st

from ackkit._core import wire

names = st.text(st.characters(min_codepoint=97, max_codepoint=122), min_size=1, max_size=6)
floats = st.floats(allow_nan=False, allow_infinity=False, width=64)
leaves = st.one_of(floats, st.integers(-(2**31), 2**31 - 1), st.booleans(), names)
values = st.recursive(
    leaves,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(names, inner, max_size=4)),
    max_leaves=12,
)
headers = st.dictionaries(names, values, max_size=6)


def _same(a: Any, b: Any) -> bool:
    if isinstance(b, float):
        return isinstance(a, float) and (a == b or (math.isnan(a) and math.isnan(b)))
    if isinstance(b, dict):
        return isinstance(a, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in b)
    if isinstance(b, list):
        return isinstance(a, list) and len(a) == len(b) and all(map(_same, a, b))
    return bool(a == b) and type(a) is not float


@given(sent=headers)
def test_pika_decoded_headers_get_their_floats_back(sent: dict[str, Any]) -> None:
    table = wire.encode_table(sent)
    pika_view, _ = pika.data.decode_table(table, 0)
    raw = wire.decode_properties(wire.encode_properties({"headers": sent}))["headers"]
    exact = wire.exact_floats(pika_view, raw)
    assert all(_same(exact[k], sent[k]) for k in sent), (sent, pika_view, exact)
    assert exact.keys() == pika_view.keys()


def test_pika_alone_reads_a_double_as_an_int() -> None:
    """Why this exists: the premise, checked on the pika installed."""
    pika_view, _ = pika.data.decode_table(wire.encode_table({"rate": 2.5}), 0)
    assert pika_view["rate"] == 2 and not isinstance(pika_view["rate"], float)


@given(sent=headers, junk=st.binary(max_size=12))
def test_a_damaged_entry_keeps_the_clients_value(sent: dict[str, Any], junk: bytes) -> None:
    raw = {k: wire.Field(b"d" + junk) for k in sent}  # truncated or overlong doubles
    assert wire.exact_floats(sent, raw).keys() == sent.keys()
