"""The core reads the broker's death records (x-death) whatever shape they arrive in: a
valid origin queue among garbage is found, and nothing raises on a hostile value.

Two layers: `deaths` on decoded values (what a client library hands over), and
`wire.lenient_table` on a header table no client library would read whole (a
timestamp past year 9999, a name that is not UTF-8 somewhere in x-death)."""

from __future__ import annotations

import struct
from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st

from ackkit._core import deaths, wire
from ackkit.dead_letters._letter import describe, replay_target
from tests.unit.test_dlq_headers import values

names = st.text(
    alphabet=st.characters(codec="ascii", categories=["L", "N", "P"]), min_size=1, max_size=40
)
not_names = st.one_of(
    st.none(),
    st.just(""),
    st.integers(),
    st.floats(allow_nan=False),
    st.booleans(),
    st.binary(min_size=1).filter(lambda b: b[:1] == b"\xff"),
    st.text(min_size=1, max_size=5).map(lambda t: t + "\x07"),
    st.just("q" * 256),
    st.lists(names, max_size=2),
    st.dictionaries(st.just("queue"), names),
)
# a table with fields of the wrong type and no usable queue
bad_tables = st.dictionaries(
    st.sampled_from(["queue", "reason", "count", "exchange", "routing-keys", "time", "x"]),
    not_names,
    max_size=5,
)
junk = st.one_of(values.filter(lambda v: not _has_table(v)), bad_tables)


def _has_table(v: Any) -> bool:
    if isinstance(v, dict):
        return True
    return isinstance(v, list) and any(_has_table(x) for x in v)


def wrap(value: Any, how: list[str]) -> Any:
    for h in how:
        value = [value] if h == "list" else (value,)
    return value


@settings(max_examples=400)
@given(
    queue=names,
    fields=bad_tables,
    before=st.lists(junk, max_size=4),
    after=st.lists(st.one_of(junk, st.fixed_dictionaries({"queue": names})), max_size=3),
    nesting=st.lists(st.sampled_from(["list", "tuple"]), max_size=deaths.MAX_DEPTH - 1),
)
@example(queue="orders", fields={}, before=[5, "x", [1]], after=[], nesting=[])
def test_the_first_valid_queue_among_garbage_is_the_origin(
    queue: str, fields: dict[str, Any], before: list[Any], after: list[Any], nesting: list[str]
) -> None:
    entry = wrap({**fields, "queue": queue}, nesting)
    h = {"x-death": [*before, entry, *after]}
    assert deaths.death_queue(h) == queue
    d = describe(h)
    assert (d.source, d.original_queue, replay_target(d)) == ("broker", queue, queue)


@given(queue=names, fields=bad_tables)
def test_a_table_where_the_list_belongs_still_names_the_queue(
    queue: str, fields: dict[str, Any]
) -> None:
    d = describe({"x-death": {**fields, "queue": queue}})
    assert d.original_queue == queue
    assert "x-death: a table where a list of tables belongs" in d.notes


@settings(max_examples=300)
@given(x_death=st.one_of(values, st.lists(st.one_of(junk, bad_tables))), other=values)
def test_garbage_alone_names_no_queue_and_never_raises(x_death: Any, other: Any) -> None:
    q = deaths.death_queue({"x-death": x_death, "x-last-death-queue": other})
    valid = set(_names_in(x_death)) | {deaths.queue_name(other)[0]}  # bytes come back as text
    assert q is None or q in valid
    deaths.last_death(x_death)  # total


def _names_in(v: Any) -> list[str]:
    found, _ = deaths.tables(v)
    return [n for t in found if (n := deaths.queue_name(t.get("queue"))[0])]


def test_depth_and_size_are_bounded() -> None:
    deep: Any = {"queue": "q"}
    for _ in range(10_000):
        deep = [deep]
    assert deaths.death_queue({"x-death": deep}) is None  # too deep to look into
    assert deaths.death_queue({"x-death": [None] * 10**6 + [{"queue": "q"}]}) is None
    assert deaths.death_queue({"x-death": [None] * 100 + [{"queue": "q"}]}) == "q"


# -- on the wire: what pika refuses whole -----------------------------------------


def _raw(tag: str, body: bytes) -> wire.Field:
    return wire.Field(tag.encode() + body)


hostile_fields = st.one_of(
    st.just(("time", _raw("T", struct.pack(">Q", 2**40)))),  # year 36812
    st.just((b"\xff\xfe", _raw("I", struct.pack(">i", 1)))),  # a name that is not UTF-8
    st.just(("reason", _raw("S", struct.pack(">I", 2) + b"\xff\xfe"))),
    st.tuples(st.sampled_from(["count", "exchange", "queue"]), values),
)


@settings(max_examples=300)
@given(
    queue=names,
    junk_fields=st.lists(hostile_fields, max_size=4),
    junk_entries=st.lists(
        st.one_of(
            values.filter(lambda v: not _has_table(v)),
            st.lists(hostile_fields, max_size=3).map(
                lambda f: {k: v for k, v in f if k != "queue"}
            ),
        ),
        max_size=3,
    ),
)
@example(
    queue="orders", junk_fields=[("time", _raw("T", struct.pack(">Q", 2**40)))], junk_entries=[]
)
def test_a_table_pika_refuses_still_names_its_queue(
    queue: str, junk_fields: list[tuple[Any, Any]], junk_entries: list[Any]
) -> None:
    entry = {k: v for k, v in junk_fields if k != "queue"} | {"queue": queue}
    table = {"x-death": [*junk_entries, entry], "other": 1}
    raw = _encode(table)
    h = wire.lenient_table(raw)
    assert deaths.death_queue(h) == queue
    assert describe(h).original_queue == queue


def _encode(table: dict[Any, Any]) -> bytes:
    parts = b""
    for k, v in table.items():
        kb = k if isinstance(k, bytes) else k.encode()
        parts += bytes((len(kb),)) + kb + wire.encode_value(_encodable(v))
    return struct.pack(">I", len(parts)) + parts


def _encodable(v: Any) -> Any:
    if isinstance(v, dict):
        return wire.Field(b"F" + _encode(v))
    if isinstance(v, list):
        inner = b"".join(wire.encode_value(_encodable(x)) for x in v)
        return wire.Field(b"A" + struct.pack(">I", len(inner)) + inner)
    if isinstance(v, str):
        return v.encode("utf-8", "surrogatepass")
    if isinstance(v, int) and not -(2**63) <= v < 2**63:
        return str(v)
    if hasattr(v, "as_tuple"):  # a Decimal the wire cannot hold
        try:
            wire.encode_value(v)
        except wire.EncodeError:
            return str(v)
    return v


@given(st.binary(max_size=200))
def test_lenient_table_never_raises(data: bytes) -> None:
    assert isinstance(wire.lenient_table(data), dict)
    assert isinstance(wire.lenient_table(struct.pack(">I", len(data)) + data), dict)
