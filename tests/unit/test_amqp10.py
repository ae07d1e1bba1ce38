"""`ackkit._core.amqp10.read` against rstream's general AMQP 1.0 decoder.

What the stream source's rows show of a record must not depend on which of the two
read it: on every message rstream can encode with scalar properties, the fast reader
reads it (it must not hand it back) and the row is the general decoder's row. On
anything else, hostile bytes included, it never raises and never overruns."""

from __future__ import annotations

import struct
import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("pyspark")
rstream = pytest.importorskip("rstream")

from rstream import amqp_decoder  # noqa: E402
from rstream._pyamqp.message import Header, Properties  # noqa: E402

from ackkit._core import amqp10  # noqa: E402
from ackkit.spark._schema import header_text  # noqa: E402
from ackkit.spark._stream_rows import StreamRowSchema, record  # noqa: E402


def _text(v: object) -> str | None:
    return None if v is None else v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)


def rstream_row(data: bytes) -> tuple[object, ...]:
    """(message_id, content_type, headers, body) of a record as rstream's decoder reads it."""
    msg = amqp_decoder(data)
    headers = None
    if msg.application_properties:
        headers = {_text(k): header_text(v) for k, v in msg.application_properties.items()}
    p = msg.properties
    mid, ctype = (None, None) if p is None else (_text(p.message_id), _text(p.content_type))
    return mid, ctype, headers, msg.body or b""


scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=False),
    st.text(max_size=20),
    st.binary(max_size=20),
    st.uuids(),
)
message_ids = st.one_of(
    st.none(), st.text(max_size=40), st.binary(max_size=40), st.integers(0, 2**63 - 1), st.uuids()
)


@st.composite
def messages(draw: st.DrawFn) -> bytes:
    props = Properties(
        message_id=draw(message_ids),
        content_type=draw(st.one_of(st.none(), st.text(max_size=30).map(str.encode))),
        subject=draw(st.one_of(st.none(), st.text(max_size=10))),
        correlation_id=draw(st.one_of(st.none(), st.text(max_size=10))),
        group_id=draw(st.one_of(st.none(), st.text(max_size=10))),
    )
    body = draw(st.binary(max_size=300 if draw(st.booleans()) else 70_000))
    kwargs = {}
    if draw(st.booleans()):
        kwargs["header"] = Header(durable=draw(st.booleans()), priority=draw(st.integers(0, 9)))
    if draw(st.booleans()):
        kwargs["message_annotations"] = {b"x-exchange": b"orders", b"x-routing-key": b"k"}
    app = draw(st.dictionaries(st.text(max_size=12), scalars, max_size=6))
    return bytes(
        rstream.AMQPMessage(
            body=body,
            properties=props if draw(st.booleans()) else None,
            application_properties=app or None,
            **kwargs,
        )
    )


@settings(max_examples=300, deadline=None)
@given(messages())
def test_the_fast_reader_reads_what_rstream_encodes_as_the_general_decoder_does(
    data: bytes,
) -> None:
    assert amqp10.read(data) is not None
    r = record("s", 0, 0, data, None)
    assert (r.message_id, r.content_type, r.headers, r.body) == rstream_row(data)


@settings(max_examples=500, deadline=None)
@given(messages(), st.data())
def test_damaged_messages_never_raise_or_overrun(data: bytes, draw: st.DataObject) -> None:
    damaged = bytearray(data)
    for _ in range(draw.draw(st.integers(1, 4))):
        if not damaged:
            break
        at = draw.draw(st.integers(0, len(damaged) - 1))
        how = draw.draw(st.sampled_from(["flip", "cut", "insert"]))
        if how == "flip":
            damaged[at] = draw.draw(st.integers(0, 255))
        elif how == "cut":
            del damaged[at:]
        else:
            damaged[at:at] = draw.draw(st.binary(min_size=1, max_size=9))
    out = amqp10.read(bytes(damaged))
    assert out is None or len(out.body or b"") <= len(damaged)
    r = record("s", 0, 0, bytes(damaged), None)  # whatever it is, a row comes out
    assert isinstance(r.body, bytes)
    assert StreamRowSchema().batch([r]).num_rows == 1


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_arbitrary_bytes_never_raise(tail: bytes) -> None:
    out = amqp10.read(b"\x00S" + tail)
    assert out is None or len(out.body or b"") <= len(tail)


def test_a_hostile_count_is_refused_without_allocating() -> None:
    # a properties list32 claiming 2**32-1 fields in 9 bytes, and a map32 likewise
    huge_list = b"\x00Ss\xd0" + struct.pack(">II", 4, 0xFFFFFFFF)
    huge_map = b"\x00St\xd1" + struct.pack(">II", 4, 0xFFFFFFFE)
    size_past_end = b"\x00Su\xb0" + struct.pack(">I", 0x7FFFFFFF) + b"abc"
    for data in (huge_list, huge_map, size_past_end):
        assert amqp10.read(data) is None
        assert record("s", 0, 0, data, None).body == data  # not AMQP 1.0: raw bytes


def test_several_data_sections_are_one_body() -> None:
    # AMQP 1.0: the body is the data sections in order (a publisher may split it)
    data = b"\x00Su\xa0\x05hello" + b"\x00Su\xb0" + struct.pack(">I", 6) + b" world"
    out = amqp10.read(data)
    assert out is not None and out.body == b"hello world"
    assert record("s", 0, 0, data, None).body == b"hello world"


def test_bodies_that_are_values_and_nested_properties() -> None:
    mid = uuid.uuid4()
    text = rstream.AMQPMessage(value="text", properties=Properties(message_id=mid))
    binary = rstream.AMQPMessage(value=b"\x00\x01")
    listed = rstream.AMQPMessage(value={"a": [1, 2.5, None]})
    seqs = rstream.AMQPMessage(sequence=[[1, "x"], [2]])
    nested = rstream.AMQPMessage(
        body=b"b", application_properties={"l": [1, "two"], "m": {"k": True}}
    )
    assert amqp10.read(bytes(text)) == amqp10.Message(mid, None, {}, None, "text")
    r = record("s", 0, 0, bytes(text), None)
    assert (r.message_id, r.body) == (str(mid), b"text")
    assert record("s", 0, 0, bytes(binary), None).body == b"\x00\x01"
    assert record("s", 0, 0, bytes(listed), None).body == b'{"a": [1, 2.5, null]}'
    assert record("s", 0, 0, bytes(seqs), None).body == b'[[1, "x"], [2]]'
    assert record("s", 0, 0, bytes(nested), None).headers == {
        "l": '[1, "two"]',
        "m": '{"k": true}',
    }


def test_values_nested_too_deep_are_not_a_message() -> None:
    deep = b"\x00Sw" + b"\xc0\x01\x01" * 40  # list8 holding a list8 holding ... 40 deep
    data = deep + b"\x45"
    assert amqp10.read(data) is None
    assert record("s", 0, 0, data, None).body == data


def test_a_char_that_is_no_character_still_makes_a_row() -> None:
    # application properties {"c": char U+D800 (a surrogate), "d": char U+1F600}
    props = b"\xc1\x11\x04\xa1\x01c\x73\x00\x00\xd8\x00\xa1\x01d\x73\x00\x01\xf6\x00"
    data = b"\x00St" + props + b"\x00Su\xa0\x01x"
    r = record("s", 0, 0, data, None)
    assert r.headers == {"c": "\ufffd", "d": "\U0001f600"}
    assert StreamRowSchema().batch([r]).num_rows == 1
