"""One rule for the ackkit-attempt header, whichever client library decoded it.

The pika runtime hands the core the header as it was on the wire (`wire.Field`:
pika itself reads a double 2.5 as the int 2); the aio-pika runtime hands it
pamqp's decoded value. For every AMQP field type, both must come to the same
verdict: an attempt number for an integer field from 1 to MAX_ATTEMPT_HEADER,
forged for anything else.
"""

from __future__ import annotations

import struct
from typing import Any

import pamqp.decode
import pika.data
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ackkit._core import headers as H
from ackkit._core.wire import Field, decode_table, encode_table

INTEGER_KINDS = {
    "b": (">b", -(2**7), 2**7 - 1),
    "B": (">B", 0, 2**8 - 1),
    "s": (">h", -(2**15), 2**15 - 1),
    "u": (">H", 0, 2**16 - 1),
    "I": (">i", -(2**31), 2**31 - 1),
    "i": (">I", 0, 2**32 - 1),
    "l": (">q", -(2**63), 2**63 - 1),
}


def _longstr(b: bytes) -> bytes:
    return struct.pack(">I", len(b)) + b


@st.composite
def fields(draw: Any) -> tuple[bytes, bool]:
    """(the encoded field, is it an attempt number by the rule?)"""
    kind = draw(st.sampled_from([*INTEGER_KINDS, "f", "d", "D", "t", "S", "x", "T", "V", "A", "F"]))
    if kind in INTEGER_KINDS:
        fmt, lo, hi = INTEGER_KINDS[kind]
        edge = st.sampled_from([lo, hi, 0, 1, 2, H.MAX_ATTEMPT_HEADER, H.MAX_ATTEMPT_HEADER + 1])
        n = draw(st.one_of(edge, st.integers(lo, hi)).filter(lambda v: lo <= v <= hi))
        return kind.encode() + struct.pack(fmt, n), 1 <= n <= H.MAX_ATTEMPT_HEADER
    if kind in "fd":
        x = draw(st.one_of(st.sampled_from([1.0, 2.0, 2.5, 3.0, 0.0, -1.0]), st.floats(-1e6, 1e6)))
        return kind.encode() + struct.pack(">" + kind, x), False
    if kind == "D":
        return b"D" + struct.pack(">Bi", draw(st.integers(0, 3)), draw(st.integers(0, 9999))), False
    if kind == "t":
        return b"t" + bytes((draw(st.integers(0, 1)),)), False
    if kind in "Sx":
        text = draw(
            st.one_of(st.sampled_from(["1", "2", "3", " 3", "abc", ""]), st.text(max_size=12))
        )
        return kind.encode() + _longstr(text.encode()), False
    if kind == "T":
        return b"T" + struct.pack(">Q", draw(st.integers(0, 2**32))), False
    if kind == "V":
        return b"V", False
    if kind == "A":
        return b"A" + _longstr(b"I" + struct.pack(">i", 2)), False
    return b"F" + encode_table({"n": 2}), False


def _table(field: bytes) -> bytes:
    return _longstr(bytes((len(H.ATTEMPT),)) + H.ATTEMPT.encode() + field)


def _verdict_of(headers: dict[str, Any], wire: dict[str, Any] | None = None) -> int | str:
    try:
        return H.attempt_of(headers, False, wire=wire)
    except H.BadAttemptHeader as exc:
        return str(exc)  # the dead letter's reason: the same words on both runtimes


@settings(max_examples=300, deadline=None)
@given(fields())
def test_one_verdict_for_every_field_type_on_both_runtimes(case: tuple[bytes, bool]) -> None:
    field, valid = case
    table = _table(field)
    wire, _ = decode_table(table)  # what the pika runtime keeps (SafeSelectConnection)
    pika_headers = pika.data.decode_table(table, 0)[0]  # what pika decodes
    _, pamqp_headers = pamqp.decode.field_table(table)  # what aio-pika hands over
    app = _verdict_of(pika_headers, wire)
    async_app = _verdict_of(pamqp_headers)
    assert app == async_app
    assert isinstance(app, int) is valid
    if valid:
        assert app == pamqp_headers[H.ATTEMPT]


@pytest.mark.parametrize(
    "raw",
    [2.5, 2.0, 3.0, "3", b"3", "2", True, None, [2], {"n": 2}],
    ids=repr,
)
def test_anything_but_an_integer_is_forged(raw: Any) -> None:
    with pytest.raises(H.BadAttemptHeader):
        H.attempt_of({H.ATTEMPT: raw}, False)


def test_a_double_on_the_wire_is_forged_though_pika_reads_an_int() -> None:
    table = _table(b"d" + struct.pack(">d", 2.5))
    assert pika.data.decode_table(table, 0)[0][H.ATTEMPT] == 2  # pika's reading
    wire, _ = decode_table(table)
    assert isinstance(wire[H.ATTEMPT], Field)
    with pytest.raises(H.BadAttemptHeader, match=r"floating-point number 2\.5"):
        H.attempt_of({H.ATTEMPT: 2}, False, wire=wire)


def test_a_broker_count_saturates() -> None:
    """x-delivery-count 2**63-1 on a redelivery: the attempt saturates, and the next
    attempt's number (a retry copy's header) still encodes."""
    n = H.attempt_of(
        {H.ATTEMPT: H.MAX_ATTEMPT_HEADER, H.X_DELIVERY_COUNT: 2**63 - 1},
        True,
        count_header=H.X_DELIVERY_COUNT,
    )
    assert n == H.ATTEMPT_CEILING
    encode_table({H.ATTEMPT: n + 1})
