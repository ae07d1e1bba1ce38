"""An AMQP 1.0 message and AMQP 0-9-1's properties, both ways, without a broker: what
ackkit publishes over AMQP 1.0 (a copy, a handler's publish), encoded and decoded as the
broker would pass it on, is read back as the same properties and body."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

pytest.importorskip("proton")
from proton import Message, symbol

from ackkit._amqp10 import messages as M
from ackkit._core import wire

names = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=20)
short = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=40)
simple = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=False),
    short,
    st.binary(max_size=40),
    st.datetimes(
        min_value=dt.datetime(1971, 1, 1),
        max_value=dt.datetime(9000, 1, 1),
        timezones=st.just(dt.UTC),
    ).map(lambda d: d.replace(microsecond=d.microsecond // 1000 * 1000)),
)
nested = st.recursive(
    simple,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(names, inner, max_size=4)),
    max_leaves=8,
)


def through_the_wire(msg: Message) -> Message:
    out = Message()
    out.decode(msg.encode())
    return out


@given(
    headers=st.dictionaries(names, nested, max_size=6),
    body=st.binary(max_size=200),
    message_id=st.one_of(st.none(), short.filter(bool)),
    correlation_id=st.one_of(st.none(), short.filter(bool)),
    content_type=st.one_of(st.none(), st.sampled_from(["application/json", "text/plain"])),
    persistent=st.booleans(),
    priority=st.one_of(st.none(), st.integers(0, 9).filter(lambda p: p != 4)),
    expiration=st.one_of(st.none(), st.integers(1, 10**9)),
    exchange=st.sampled_from(["", "orders", "a/b c"]),
    routing_key=st.sampled_from(["q", "", "x.y/z"]),
)
def test_properties_survive_a_publish_over_amqp10(
    headers: dict[str, Any],
    body: bytes,
    message_id: str | None,
    correlation_id: str | None,
    content_type: str | None,
    persistent: bool,
    priority: int | None,
    expiration: int | None,
    exchange: str,
    routing_key: str,
) -> None:
    props = {
        "headers": headers,
        "message_id": message_id,
        "correlation_id": correlation_id,
        "content_type": content_type,
        "delivery_mode": 2 if persistent else 1,
        "priority": priority,
        "expiration": None if expiration is None else str(expiration),
    }
    msg = through_the_wire(M.message_of(props, body, exchange, routing_key))
    assert M.body_of(msg) == body
    back, _, _ = M.properties_of(msg)
    assert (back.headers or {}) == headers
    assert back.message_id == message_id
    assert back.correlation_id == correlation_id
    assert back.content_type == content_type
    assert back.delivery_mode == props["delivery_mode"]
    assert back.priority == priority
    assert back.expiration == props["expiration"]
    assert msg.address == M.address(exchange, routing_key)


def test_headers_kept_as_they_were_on_the_wire_are_published_by_value() -> None:
    raw = wire.decode_properties(wire.encode_properties({"headers": {"n": 2.5, "s": "x"}}))
    msg = through_the_wire(M.message_of(raw, b"b", "", "q"))
    assert M.properties_of(msg)[0].headers == {"n": 2.5, "s": "x"}


def test_x_headers_are_annotations_and_rabbitmqs_own_are_read_back() -> None:
    msg = M.message_of({"headers": {"x-death": [{"count": 1}], "plain": 1}}, b"", "e", "k")
    assert msg.annotations == {symbol("x-death"): [{"count": 1}]}
    assert msg.properties == {"plain": 1}
    got = Message(body=b"x", inferred=True)
    got.annotations = {
        symbol("x-exchange"): "orders",
        symbol("x-routing-key"): "eu",
        symbol("x-opt-deaths"): [{"reason": "rejected"}],
        symbol("x-basic-type"): "t",
    }
    props, exchange, rk = M.properties_of(through_the_wire(got))
    assert (exchange, rk, props.type) == ("orders", "eu", "t")
    assert props.headers == {"x-opt-deaths": [{"reason": "rejected"}]}


@pytest.mark.parametrize("body", [["a", 1], {"k": 2}, 7])
def test_a_body_a_handler_cannot_take_is_kept_encoded(body: Any) -> None:
    msg = through_the_wire(Message(body=body))
    with pytest.raises(M.Unreadable) as e:
        M.body_of(msg)
    assert e.value.body.startswith(b"\x00Sw")  # the amqp-value section, whole


def test_a_string_body_is_its_utf8_bytes_and_no_body_is_empty() -> None:
    assert M.body_of(through_the_wire(Message(body="zé"))) == "zé".encode()
    assert M.body_of(through_the_wire(Message())) == b""


@pytest.mark.parametrize(
    ("exchange", "rk", "address"),
    [
        ("", "q", "/queues/q"),
        ("", "a/b c", "/queues/a%2Fb%20c"),
        ("ex", "", "/exchanges/ex"),
        ("ex", "k.1", "/exchanges/ex/k.1"),
    ],
)
def test_addresses_are_rabbitmqs_v2_form(exchange: str, rk: str, address: str) -> None:
    assert M.address(exchange, rk) == address
