"""What a copy carries (ackkit/_core/copies.py, _core/wire.py) and the bounded rule for a
copy that could not be published (ListenerCore.republished), without a broker."""

from __future__ import annotations

import datetime as dt
import decimal
import struct
from typing import Any

import pika
from hypothesis import given, settings
from hypothesis import strategies as st

from ackkit import Retry
from ackkit._core import copies, wire
from ackkit._core import headers as H
from ackkit._core.actions import Reject, Republish
from ackkit._core.events import Stage
from ackkit._core.listener import ListenerCore
from ackkit._core.policy import ListenerPolicy

text = st.text(alphabet=st.characters(codec=None, exclude_categories=()), max_size=40)
leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=False),
    text,
    st.binary(max_size=20),
    st.decimals(places=2, min_value=-(10**6), max_value=10**6),
    st.datetimes(min_value=dt.datetime(1970, 1, 2), max_value=dt.datetime(2100, 1, 1)),
)
values = st.recursive(
    leaf,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=10,
)
names = st.text(max_size=20) | st.sampled_from(
    ["x-death", "x-first-death-queue", "x-last-death-reason", "x-delivery-count", "CC", "BCC"]
)


def fits(c: copies.Copy, frame_max: int) -> None:
    raw = wire.encode_properties(c.properties)
    assert len(raw) + wire.FRAME_OVERHEAD == c.size <= frame_max
    back = wire.decode_properties(raw)
    assert H.REASON in back["headers"]
    assert not any(copies.broker_owned(k) for k in back["headers"])


@settings(max_examples=150, deadline=None)
@given(
    theirs=st.dictionaries(names, values, max_size=6),
    pad=st.integers(0, 140_000),
    reason=text,
    message=st.text(max_size=3000),
    tb=st.text(max_size=9000),
    frame_max=st.sampled_from([4096, 8192, 131072]),
    purpose=st.sampled_from(["retry", "dead-letter", "restamp"]),
    minimal=st.booleans(),
)
def test_any_input_gives_a_copy_that_encodes_and_fits(
    theirs: dict[str, Any],
    pad: int,
    reason: str,
    message: str,
    tb: str,
    frame_max: int,
    purpose: str,
    minimal: bool,
) -> None:
    theirs = {**theirs, "pad": "p" * pad, "bad": "\ud800 lone"}
    ours = {
        H.REASON: reason + "\udfff",
        H.ERROR_MESSAGE: message,
        H.ERROR_TRACEBACK: tb,
        "ackkit-x": {"nested": ["\ud834", 1.5]},
    }
    original = {"headers": theirs, "expiration": "60000", "message_id": "m"}
    c = copies.copy_properties(
        original, ours, purpose=purpose, minimal=minimal, frame_max=frame_max
    )
    fits(c, frame_max)
    # the bytes the core kept are the copy's encoding as it is (a client sends them as
    # they are): kept whenever the copy did not change after its last encoding
    assert c.encoded is None or c.encoded == wire.encode_properties(c.properties)
    h = c.properties["headers"]
    assert "\ufffd" in h[H.REASON]
    if not minimal and H.HEADERS_DROPPED not in h:
        assert h["pad"] == "p" * pad  # kept whole, or left off and said so


def test_a_copy_keeps_every_amqp_type_byte_for_byte() -> None:
    raw = {
        "t": b"t\x01",
        "b": b"b\xff",
        "B": b"B\xc8",
        "s": b"s\x80\x00",
        "u": b"u\xff\xff",
        "I": b"I" + struct.pack(">i", -5),
        "i": b"i" + struct.pack(">I", 2**32 - 1),
        "L": b"L" + struct.pack(">q", -(2**60)),
        "l": b"l" + struct.pack(">q", 7),
        "f": b"f" + struct.pack(">f", 2.5),
        "d": b"d" + struct.pack(">d", 0.1),
        "D": b"D\x02" + struct.pack(">i", 150),
        "S": b"S\x00\x00\x00\x02\xff\xfe",  # not UTF-8
        "x": b"x\x00\x00\x00\x01\x00",
        "T": b"T" + struct.pack(">Q", 2**40),
        "V": b"V",
        "A": b"A\x00\x00\x00\x03b\x01V",
        "F": b"F\x00\x00\x00\x04\x01kb\x01",
    }
    table = struct.pack(">I", sum(2 + len(v) for v in raw.values())) + b"".join(
        bytes([1]) + k.encode() + v for k, v in raw.items()
    )
    headers, _ = wire.decode_table(table)
    for purpose in ("retry", "dead-letter", "restamp"):
        c = copies.copy_properties({"headers": headers}, {H.REASON: "r"}, purpose=purpose)
        back = wire.decode_properties(wire.encode_properties(c.properties))["headers"]
        assert {k: back[k].raw for k in raw} == raw


def test_values_a_client_decoded_keep_value_and_type() -> None:
    """What pika and pamqp hand over, encoded so that the value comes back the same:
    a float stays a double (pika: int; pamqp: single precision), bytes stay a string."""
    h = {
        "f": 0.1,
        "big": 2**40,
        "dec": decimal.Decimal("1.50"),
        "raw": b"\xff",
        "ba": bytearray(b"\x00"),
    }
    c = copies.copy_properties({"headers": h}, {H.REASON: "r"})
    raw = wire.encode_properties(c.properties)
    got, _ = pika.data.decode_table(raw, 2)  # after the flags: the headers come first
    assert struct.unpack(">d", wire.decode_properties(raw)["headers"]["f"].raw[1:])[0] == 0.1
    assert got["big"] == 2**40 and got["dec"] == decimal.Decimal("1.50")
    assert got["raw"] == b"\xff" and got["ba"] == b"\x00"


def test_what_each_purpose_keeps_drops_and_adds() -> None:
    original = {
        "expiration": "1000",
        "user_id": "alice",
        "priority": 3,
        "headers": {"x-death": [{"count": "junk"}], "x-first-death-queue": 5, "CC": ["q2"], "k": 1},
    }
    for purpose, keeps_ttl in (("retry", False), ("dead-letter", False), ("restamp", True)):
        c = copies.copy_properties(original, {H.REASON: "r"}, purpose=purpose, user="bob")
        p = c.properties
        assert ("expiration" in p) is keeps_ttl
        assert (H.ORIGINAL_EXPIRATION in p["headers"]) is not keeps_ttl
        assert "user_id" not in p and p["headers"][H.ORIGINAL_USER_ID] == "alice"
        assert p["priority"] == 3 and p["headers"]["k"] == 1
        assert set(p["headers"]) & {"x-death", "x-first-death-queue", "CC"} == set()
    same_user = copies.copy_properties(original, {}, user="alice").properties
    assert same_user["user_id"] == "alice"


def test_headers_near_frame_max_shrink_ours_first_then_drop_theirs() -> None:
    tb = "T" * 4000
    limit = 131072 - wire.FRAME_OVERHEAD
    for room in (0, 50, 3000, 5000, 20000):
        pad = limit - room - 20
        c = copies.copy_properties(
            {"headers": {"pad": "p" * pad}},
            {H.REASON: "r", H.ERROR_TRACEBACK: tb},
            frame_max=131072,
        )
        h = c.properties["headers"]
        assert c.size <= 131072
        if room >= 5000:
            assert h[H.ERROR_TRACEBACK] == tb and "pad" in h
        elif "pad" in h:
            assert len(h[H.ERROR_TRACEBACK]) < len(tb) and H.COPY_NOTE in h
        else:
            assert h[H.HEADERS_DROPPED] > pad and h[H.ERROR_TRACEBACK] == tb


def _core(**kw: Any) -> ListenerCore:
    c = ListenerCore(ListenerPolicy(name="l", queue="q", **kw))
    c.channel_opened()
    return c


def test_an_unpublishable_copy_gets_one_minimal_copy_then_a_reject() -> None:
    c = _core()
    t = c.receive(1)
    (first,) = c.finish(t, ValueError("\ud800"))
    assert isinstance(first, Republish) and not first.minimal
    (again,) = c.republished(first.token, False, error="encode failed")
    assert isinstance(again, Republish) and again.minimal and again.routing_key == first.routing_key
    assert "encode failed" in again.set_headers[H.COPY_NOTE]
    assert c.republished(again.token, False, error="still") == [Reject(1, requeue=False)]
    assert c.gauges().republishing == 0 and c.gauges().outstanding == 0


def test_broker_nacks_requeue_every_original_however_many_in_a_row() -> None:
    """There is no listener-wide budget of refusals any more: the fifth, the fiftieth
    refused copy returns its original like the first (it used to be rejected)."""
    c = _core(retry=Retry(max_attempts=3, initial_interval=0.05))
    for tag in range(1, 51):
        t = c.receive(tag)
        (a,) = c.finish(t, ValueError("x"))
        assert c.republished(a.token, False) == [Reject(tag, requeue=True)]
    assert c.counters.counts[Stage.COPY_REFUSED] == 50
    assert c.counters.counts[Stage.REJECTED] == 0


def test_a_copy_that_fits_at_once_keeps_its_encoding_for_the_client() -> None:
    """The usual dead letter: encoded once while it is fitted, and the client sends those
    bytes (the sync runtime's WireProperties) instead of encoding it again."""
    from ackkit._sync._pika import WireProperties

    original = {"headers": {"k": "v", "n": 7}, "message_id": "m", "content_type": "a/b"}
    c = copies.copy_properties(original, {H.REASON: "poison"}, purpose="dead-letter")
    assert c.encoded is not None and c.encoded == wire.encode_properties(c.properties)
    assert WireProperties(c.properties, c.encoded).encode() == [c.encoded]
