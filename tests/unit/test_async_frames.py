"""The aiormq frame filter's cheap paths agree with pamqp and pass frames through unchanged."""

from __future__ import annotations

import asyncio
import struct

from hypothesis import given, settings
from hypothesis import strategies as st
from pamqp.header import ContentHeader

from ackkit._async import _frames as aframes
from ackkit._wire import read_delivery_method
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
        size + encode_properties({"headers": {"a": 1}}),  # a table: pamqp decides
        size + encode_properties({"timestamp": 2**62}),  # pamqp fails: past year 9999
        plain[:15],  # message_id missing: pamqp fails
    ):
        assert not aframes._plain_header(other)


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
