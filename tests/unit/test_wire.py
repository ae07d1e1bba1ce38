"""ackkit._connection.salvage and the frame hooks: salvaging a content header a client
library cannot read."""

from __future__ import annotations

import asyncio
import struct
from typing import Any

import pamqp.frame
import pika.data
import pika.frame
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ackkit._async import _frames as aframes
from ackkit._connection.salvage import read_delivery_method, salvage_header
from ackkit._sync import _frames as sframes
from tests.adversarial.rawamqp import Field, encode_properties, encode_table, nested_table, shortstr


def header(fields: dict[str, Any], raw_table: bytes | None = None, size: int = 5) -> bytes:
    return struct.pack(">HHQ", 60, 0, size) + encode_properties(fields, raw_table)


def pika_table(raw: bytes) -> Any:
    return pika.data.decode_table(raw, 0)[0]


def test_readable_header_salvages_everything() -> None:
    fields = {"content_type": "a/b", "message_id": "m", "priority": 3, "timestamp": 10}
    s = salvage_header(header({**fields, "headers": {"k": 1}}), pika_table)
    assert s.problems == [] and s.body_size == 5
    assert s.fields == {**fields, "headers": {"k": 1}}


@pytest.mark.parametrize(
    ("fields", "raw", "word", "kept"),
    [
        ({"message_id": b"\xff", "app_id": "ok"}, None, "message_id is not UTF-8", "app_id"),
        ({"timestamp": 2**62, "type": "t"}, None, "past year 9999", "type"),
        ({"content_type": "c"}, nested_table(5000), "nested too deep", "content_type"),
        ({"priority": 1}, encode_table({"t": Field("T", 2**50)}), "year", "priority"),
    ],
)
def test_one_bad_property_leaves_the_others(fields: Any, raw: Any, word: str, kept: str) -> None:
    s = salvage_header(header(fields, raw), pika_table)
    assert word in s.reason
    assert kept in s.fields


def test_truncated_properties_say_so() -> None:
    h = header({"message_id": "abc", "app_id": "x"})
    s = salvage_header(h[:-2], pika_table)
    assert "truncated" in s.reason and s.fields["message_id"] == "abc"
    with pytest.raises(ValueError):
        salvage_header(h[:8], pika_table)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=64))
def test_salvage_never_raises_past_the_fixed_part(tail: bytes) -> None:
    s = salvage_header(struct.pack(">HHQ", 60, 0, 7) + tail, pika_table)
    assert s.body_size == 7


def test_read_delivery_method_reads_non_utf8_names_leniently() -> None:
    deliver = struct.pack(">HH", 60, 60) + shortstr("ctag") + struct.pack(">QB", 42, 1)
    m = read_delivery_method(deliver + shortstr("ex") + shortstr(b"rk\xff"))
    assert m is not None and m.delivery_tag == 42 and m.redelivered
    assert m.problems == ("routing key is not UTF-8",) and m.routing_key.startswith("rk")
    get_ok = struct.pack(">HHQB", 60, 71, 7, 0) + shortstr(b"\xfe") + shortstr("r")
    m = read_delivery_method(get_ok + struct.pack(">I", 3))
    assert m is not None and m.message_count == 3 and m.problems == ("exchange is not UTF-8",)
    assert read_delivery_method(struct.pack(">HH", 60, 80)) is None


def frame(ftype: int, channel: int, payload: bytes) -> bytes:
    return struct.pack(">BHI", ftype, channel, len(payload)) + payload + b"\xce"


def test_pika_connection_salvages_instead_of_raising() -> None:
    payload = header({"message_id": "m"}, nested_table(5000))
    with pytest.raises(RecursionError):
        pika.frame.decode_frame(frame(2, 1, payload))
    n, h = sframes._salvage_frame(frame(2, 1, payload), RecursionError())  # type: ignore[misc]
    assert n == len(frame(2, 1, payload)) and h.body_size == 5
    assert h.properties.message_id == "m"
    assert "nested too deep" in sframes.unreadable(object(), h.properties)


def test_aiormq_filter_rewrites_only_what_pamqp_cannot_read() -> None:
    deliver = struct.pack(">HH", 60, 60) + shortstr("c") + struct.pack(">QB", 9, 0)
    deliver += shortstr("") + shortstr(b"k\xff")
    good = frame(2, 1, header({"message_id": "ok"}))
    stream = (
        frame(1, 1, deliver)
        + frame(2, 1, header({"message_id": b"\xff", "app_id": "a"}))
        + frame(3, 1, b"hello")
        + good
    )

    async def run() -> list[Any]:
        reader = asyncio.StreamReader()
        reader.feed_data(stream)
        reader.feed_eof()
        reasons = aframes.Reasons()
        f = aframes.FrameFilter(reader, reasons)
        out = []
        while True:
            try:
                head = await f.readexactly(7)
            except asyncio.IncompleteReadError:
                break
            size = struct.unpack(">BHI", head)[2]
            out.append(pamqp.frame.unmarshal(head + await f.readexactly(size + 1))[2])
        out.append(reasons.pop(1, 9))
        return out

    d, h, body, g, why = asyncio.run(run())
    assert d.delivery_tag == 9 and d.routing_key == "k\ufffd"
    assert h.body_size == 5 and h.properties.app_id == "a" and h.properties.message_id is None
    assert body.value == b"hello"
    assert g.properties.message_id == "ok"
    assert "routing key is not UTF-8" in why and "message_id is not UTF-8" in why
