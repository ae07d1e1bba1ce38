"""The same publish call gives the same message on the wire, whichever front takes it.

App.publish, AsyncApp.publish, Delivery.publish, AsyncDelivery.publish, both pull
connections' publish and the test kit's broker.publish, on the in-memory broker:
the frames it records (the encoded content header and the body) must be byte for
byte the same for the same arguments (the real-broker twin:
tests/integration/test_publish_fronts.py).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from ackkit._core import wire
from ackkit.errors import MessageUnroutable
from ackkit.testing import InMemoryBroker
from tests.unit._fronts import FRONTS, Fronts, fronts


class Order(BaseModel):
    id: int
    note: str


text = st.text(st.characters(min_codepoint=32, max_codepoint=0x2FFF), max_size=24)
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**53), 2**53)
    | st.floats(allow_nan=False, allow_infinity=False)
    | text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(text, inner, max_size=3),
    max_leaves=6,
)
bodies = st.one_of(
    st.binary(max_size=48),
    text,
    st.builds(Order, id=st.integers(0, 10**6), note=text),
    json_values,
)
header_values = st.one_of(
    st.integers(-(2**31), 2**31 - 1),
    st.booleans(),
    text,
    st.floats(allow_nan=False, allow_infinity=False),
    st.lists(st.integers(0, 99) | text, max_size=3),
)
options = st.fixed_dictionaries(
    {"message_id": text.filter(bool)},
    optional={
        "headers": st.dictionaries(text.filter(bool), header_values, max_size=4),
        "correlation_id": text,
        "content_type": st.sampled_from([None, "auto", "text/plain", "application/x+json"]),
        "persistent": st.booleans(),
        "priority": st.integers(0, 9),
        "reply_to": text,
        "type": text,
        "app_id": text,
        "expiration": st.integers(60_000, 10**8).map(str),
        "timestamp": st.integers(0, 2**32),
        "content_encoding": st.sampled_from(["utf-8", "gzip"]),
    },
)


@pytest.fixture(scope="module")
def memory() -> Iterator[tuple[InMemoryBroker, Fronts]]:
    with InMemoryBroker() as broker, fronts(broker) as f:
        f.pull.declare_queue("table")
        yield broker, f


def recorded(broker: InMemoryBroker, queue: str) -> list[tuple[str, str, bytes, bytes]]:
    """What the broker holds in `queue`, as it was on the wire (and takes it out)."""
    q = broker.model.queues[queue]
    with broker.model.lock:
        got = [(m.exchange, m.routing_key, m.props, m.body) for _, m in q.ready]
        q.ready.clear()
    return got


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(body=bodies, opts=options)
def test_every_front_sends_the_same_bytes(
    memory: tuple[InMemoryBroker, Fronts], body: Any, opts: dict[str, Any]
) -> None:
    broker, f = memory
    for front in FRONTS:
        f.publish(front, "table", body, **opts)
    got = recorded(broker, "table")
    assert len(got) == len(FRONTS)
    for front, frame in zip(FRONTS, got, strict=True):
        assert frame == got[0], f"{front} sent another message than {FRONTS[0]}"
    props = wire.decode_properties(got[0][2])
    assert props["message_id"] == opts["message_id"]
    assert props["delivery_mode"] == (2 if opts.get("persistent", True) else 1)


def test_the_defaults_are_the_same_on_every_front(memory: tuple[InMemoryBroker, Fronts]) -> None:
    broker, f = memory
    for body, content_type in [({"a": 1}, "application/json"), (b"\x00", None), ("t", None)]:
        for front in FRONTS:
            f.publish(front, "table", body)
        got = [wire.decode_properties(p) for _, _, p, _ in recorded(broker, "table")]
        assert len(got) == len(FRONTS)
        ids = [p.pop("message_id") for p in got]
        assert all(re.fullmatch("[0-9a-f]{32}", i) for i in ids), ids
        assert len(set(ids)) == len(ids)  # a new one each time
        want = {"delivery_mode": 2} | ({"content_type": content_type} if content_type else {})
        assert got == [want] * len(FRONTS), dict(zip(FRONTS, got, strict=True))


def test_replies_are_the_same_from_either_delivery(memory: tuple[InMemoryBroker, Fronts]) -> None:
    broker, f = memory
    f.replies["Delivery.reply"]({"ok": 1}, message_id="r")
    f.replies["AsyncDelivery.reply"]({"ok": 1}, message_id="r")
    got = recorded(broker, f.reply_to)
    assert len(got) == 2 and got[0] == got[1]
    assert wire.decode_properties(got[0][2])["correlation_id"] == "c-1"


@pytest.mark.parametrize("front", FRONTS)
def test_a_bad_option_fails_at_the_call_on_every_front(
    memory: tuple[InMemoryBroker, Fronts], front: str
) -> None:
    broker, f = memory
    with pytest.raises(TypeError, match="contnet_type"):
        f.publish(front, "table", b"x", contnet_type="text/plain")
    with pytest.raises(ValueError, match="headers"):
        f.publish(front, "table", b"x", headers={"n": 2**70})
    with pytest.raises(MessageUnroutable):
        f.publish(front, "nobody.listens", b"x")
    assert recorded(broker, "table") == []
