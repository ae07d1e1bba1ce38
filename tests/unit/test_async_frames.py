"""The aiormq frame filter's cheap paths agree with pamqp and pass frames through unchanged."""

from __future__ import annotations

import asyncio
import logging
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pamqp.header import ContentHeader

from ackkit._async import _frames as aframes
from ackkit._connection.salvage import read_delivery_method
from tests.adversarial.rawamqp import encode_properties, shortstr

SHORTSTRS = (
    "content_type",
    "content_encoding",
    "correlation_id",
    "reply_to",
    "expiration",
    "message_id",
    "type",
    "user_id",
    "app_id",
    "cluster_id",
)
names = st.binary(max_size=12) | st.text(max_size=12).map(str.encode)


def frame(ftype: int, channel: int, payload: bytes) -> bytes:
    return struct.pack(">BHI", ftype, channel, len(payload)) + payload + b"\xce"


def deliver(ctag: bytes, tag: int, exchange: bytes, rk: bytes) -> bytes:
    out = struct.pack(">HH", 60, 60) + shortstr(ctag) + struct.pack(">QB", tag, 0)
    return out + shortstr(exchange) + shortstr(rk)


@st.composite
def headers(draw: st.DrawFn) -> bytes:
    fields = draw(st.dictionaries(st.sampled_from(SHORTSTRS), names, max_size=4))
    props: dict[str, object] = dict(fields)
    for octet in ("delivery_mode", "priority"):
        if draw(st.booleans()):
            props[octet] = draw(st.integers(0, 255))
    if draw(st.booleans()):
        props["timestamp"] = draw(st.integers(0, 2**64 - 1))
    if draw(st.booleans()):
        props["headers"] = draw(st.sampled_from([{}, {"a": 1}, {"k": "v"}]))
    size = draw(st.integers(0, 2**64 - 1))
    payload = struct.pack(">HHQ", 60, 0, size) + encode_properties(props)
    cut = draw(st.integers(0, len(payload)))
    return payload if draw(st.booleans()) else payload[:cut]


def pamqp_reads(payload: bytes) -> bool:
    try:
        ContentHeader().unmarshal(payload)
    except Exception:
        return False
    return True


@settings(max_examples=400)
@given(headers())
def test_a_header_passed_without_pamqp_is_one_pamqp_reads(payload: bytes) -> None:
    if aframes._plain_header(payload):
        assert pamqp_reads(payload)


def test_plain_headers_take_the_cheap_path_and_others_do_not() -> None:
    size = struct.pack(">HHQ", 60, 0, 200)  # a body size with a byte >= 0x80
    plain = size + encode_properties({"delivery_mode": 2, "message_id": "m-1"})
    assert aframes._plain_header(plain) and pamqp_reads(plain)
    assert aframes._plain_header(plain[:-1]) and pamqp_reads(plain[:-1])  # pamqp is lenient
    aio_pika_default = size + encode_properties(
        {"headers": {}, "delivery_mode": 2, "priority": 0, "cluster_id": ""}
    )
    assert aframes._plain_header(aio_pika_default) and pamqp_reads(aio_pika_default)
    for other in (
        size + encode_properties({"message_id": b"\xff"}),  # pamqp fails: not UTF-8
        size + encode_properties({"headers": {"\u00e9": 1}}),  # a name not ASCII: pamqp decides
        size + encode_properties({"timestamp": 2**62}),  # pamqp fails: past year 9999
        plain[:15],  # message_id missing: pamqp fails
    ):
        assert not aframes._plain_header(other)


def test_headers_tables_of_plain_values_take_the_cheap_path() -> None:
    size = struct.pack(">HHQ", 60, 0, 200)
    tables = (
        {"ackkit-attempt": 2, "x-delivery-count": 300, "n": -(2**40), "ok": True, "f": 0.5},
        {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
        {"nested": {"list": [1, "two", {"three": b"\xff\x00"}], "none": None}},
        {"text": "caf\u00e9 \u2603"},  # a long string value need not be ASCII
    )
    for table in tables:
        payload = size + encode_properties({"headers": table, "delivery_mode": 2})
        assert aframes._plain_header(payload) and pamqp_reads(payload), table
    for table in (
        {"bad": {"\xff": 1}},  # a name not ASCII (here UTF-8): pamqp decides
        {"deep": _nest(20)},  # deeper than the cheap path looks
    ):
        payload = size + encode_properties({"headers": table})
        assert not aframes._plain_header(payload)


def _nest(depth: int) -> object:
    return {"d": _nest(depth - 1)} if depth else 1


_FIXED_SIZES = {b"t": 1, b"b": 1, b"B": 1, b"s": 2, b"u": 2, b"I": 4, b"i": 4, b"l": 8}
_FIXED_SIZES |= {b"L": 8, b"f": 4, b"d": 8, b"V": 0, b"\x00": 0, b"D": 5, b"Z": 0}
_TIMESTAMPS = (0, 2**32 - 1, 2**32, 253_402_300_799_000, 253_402_300_799_001, 2**64 - 1)


@st.composite
def raw_value(draw: st.DrawFn, depth: int = 0) -> bytes:
    """A typed field value as raw bytes: of every type, unknown ones, lengths that lie."""
    kinds = [*_FIXED_SIZES, b"S", b"x", b"T"] + ([b"F", b"A"] if depth < 3 else [])
    kind = draw(st.sampled_from(kinds))
    if kind == b"T":
        ts = draw(st.sampled_from(_TIMESTAMPS) | st.integers(0, 2**64 - 1))
        return kind + struct.pack(">Q", ts)
    if kind in _FIXED_SIZES:
        n = _FIXED_SIZES[kind]
        return kind + draw(st.binary(min_size=n, max_size=n))
    if kind == b"A":
        body = b"".join(draw(st.lists(raw_value(depth + 1), max_size=3)))
    elif kind == b"F":
        body = b"".join(draw(st.lists(raw_field(depth + 1), max_size=3)))
    else:
        body = draw(st.binary(max_size=6))
    lie = draw(st.sampled_from((0, 0, 0, 1, -1)))
    return kind + struct.pack(">I", max(0, len(body) + lie)) + body


@st.composite
def raw_field(draw: st.DrawFn, depth: int = 0) -> bytes:
    return shortstr(draw(names)) + draw(raw_value(depth))


@settings(max_examples=600, deadline=None)
@given(
    st.lists(raw_field(), max_size=4),
    st.sampled_from((0, 0, 0, 1, -1, 3)),
    st.booleans(),
    st.integers(0, 200),
)
def test_a_headers_table_passed_without_pamqp_is_one_pamqp_reads(
    fields: list[bytes], lie: int, more: bool, cut: int
) -> None:
    body = b"".join(fields)
    table = struct.pack(">I", max(0, len(body) + lie)) + body
    flags = 0x2000 | (0x1000 if more else 0)  # headers, maybe delivery_mode after them
    payload = struct.pack(">HHQH", 60, 0, 10, flags) + table + (b"\x02" if more else b"")
    for p in (payload, payload[: len(payload) - cut]):
        if aframes._plain_header(p):
            assert pamqp_reads(p)


@settings(max_examples=400)
@given(names, st.integers(0, 2**64 - 1), names, names, st.integers(0, 40), st.booleans())
def test_a_delivery_tag_read_cheaply_is_the_one_read_delivery_method_reads(
    ctag: bytes, tag: int, exchange: bytes, rk: bytes, cut: int, whole: bool
) -> None:
    payload = deliver(ctag, tag, exchange, rk)
    if not whole:
        payload = payload[: max(4, len(payload) - cut)]
    fast = aframes._ascii_delivery_tag(payload)
    slow = read_delivery_method(payload)
    if fast is not None:
        assert slow is not None and slow.delivery_tag == fast == tag and not slow.problems
    if whole and exchange.isascii() and rk.isascii():
        assert fast == tag


frames = st.one_of(
    st.builds(
        lambda t, rk: frame(1, 1, deliver(b"c", t, b"", rk.encode())),
        st.integers(1, 2**40),
        st.text(max_size=12),
    ),
    headers().map(lambda p: frame(2, 1, p)).filter(lambda f: pamqp_reads(f[7:-1])),
    st.binary(max_size=300).map(lambda b: frame(3, 1, b)),
    st.just(frame(8, 0, b"")),  # heartbeat
    st.binary(max_size=40).map(lambda r: frame(1, 0, struct.pack(">HH", 10, 60) + shortstr(r))),
    st.just(frame(1, 0, struct.pack(">HH", 10, 61))),  # connection.unblocked
    st.binary(max_size=30).map(lambda b: frame(1, 0, struct.pack(">HH", 10, 50) + b)),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(frames, max_size=12), st.lists(st.integers(1, 64), min_size=1, max_size=20))
def test_readable_frames_pass_unchanged_however_they_are_read(
    stream: list[bytes], sizes: list[int]
) -> None:
    data = b"".join(stream)

    async def run() -> tuple[bytes, bytes]:
        out, aiormq_way = bytearray(), bytearray()
        reader = asyncio.StreamReader()
        reader.feed_data(data)
        reader.feed_eof()
        f = aframes.FrameFilter(reader, aframes.Reasons())
        i = 0
        while not f.at_eof():
            try:
                out += await f.readexactly(sizes[i % len(sizes)])
            except asyncio.IncompleteReadError as exc:
                out += exc.partial
                break
            i += 1
        reader = asyncio.StreamReader()
        reader.feed_data(data)
        reader.feed_eof()
        f = aframes.FrameFilter(reader, aframes.Reasons())
        while not f.at_eof():  # aiormq's frame receiver: 1, 6, then the rest
            head = await f.readexactly(1) + await f.readexactly(6)
            aiormq_way += head + await f.readexactly(struct.unpack(">I", head[3:])[0] + 1)
        return bytes(out), bytes(aiormq_way)

    assert asyncio.run(run()) == (data, data)


def test_the_brokers_block_and_unblock_are_logged_in_ackkits_words(
    caplog: pytest.LogCaptureFixture,
) -> None:
    blocked = frame(1, 0, struct.pack(">HH", 10, 60) + shortstr(b"low on memory"))
    unblocked = frame(1, 0, struct.pack(">HH", 10, 61))

    async def run() -> bytes:
        reader = asyncio.StreamReader()
        reader.feed_data(blocked + unblocked)
        reader.feed_eof()
        f = aframes.FrameFilter(reader, aframes.Reasons(), "orders-app")
        return await f.readexactly(len(blocked)) + await f.readexactly(len(unblocked))

    with caplog.at_level(logging.INFO, logger="ackkit"):
        assert asyncio.run(run()) == blocked + unblocked
    lines = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "ackkit"]
    assert len(lines) == 2, lines
    assert lines[0][0] == logging.WARNING
    assert "blocked connection 'orders-app' (low on memory" in lines[0][1]
    assert lines[1] == (
        logging.INFO,
        "the broker unblocked connection 'orders-app': publishes and copies go out again",
    )
