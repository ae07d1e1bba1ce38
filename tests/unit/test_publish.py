"""What a publish sends (`ackkit._messages.publish`), checked without a broker."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel

import ackkit
from ackkit._core import wire
from ackkit._core.tb import qualname
from ackkit._messages.publish import failure, outgoing, reply

names = st.text(st.characters(min_codepoint=32, max_codepoint=0x2FFF), max_size=40)
header_values = st.one_of(
    st.integers(-(2**31), 2**31 - 1),
    st.booleans(),
    names,
    st.floats(allow_nan=False, allow_infinity=False),
)


class Order(BaseModel):
    id: int


@given(
    rk=names,
    exchange=names,
    headers=st.dictionaries(names.filter(bool), header_values, max_size=5),
    correlation_id=st.none() | names,
    persistent=st.booleans(),
    priority=st.none() | st.integers(0, 9),
)
def test_options_become_the_properties_sent(
    rk: str,
    exchange: str,
    headers: dict[str, Any],
    correlation_id: str | None,
    persistent: bool,
    priority: int | None,
) -> None:
    m = outgoing(
        rk,
        {"a": 1},
        exchange=exchange,
        headers=headers,
        correlation_id=correlation_id,
        persistent=persistent,
        priority=priority,
    )
    p = m.properties
    assert (m.exchange, m.routing_key) == (exchange, rk)
    assert p["content_type"] == "application/json" and json.loads(m.body) == {"a": 1}
    assert p["delivery_mode"] == (2 if persistent else 1)
    assert p.get("headers") == (headers or None)
    assert p.get("correlation_id") == correlation_id
    assert p.get("priority") == priority
    assert len(p["message_id"]) == 32
    wire.encode_properties(p)  # what goes on the wire can be written


def test_bodies_and_their_content_types() -> None:
    assert outgoing("q", Order(id=1)).body == b'{"id":1}'
    assert outgoing("q", b"\x00").properties.get("content_type") is None
    assert outgoing("q", "t\u00e9").body == "t\u00e9".encode()
    assert outgoing("q", "x", content_type="text/plain").properties["content_type"] == "text/plain"
    assert outgoing("q", "x", message_id="m").properties["message_id"] == "m"
    with pytest.raises(TypeError, match="body must be"):
        outgoing("q", {1, 2})
    with pytest.raises(TypeError, match="body must be"):
        outgoing("q", float("nan"))


@pytest.mark.parametrize(
    ("kw", "err"),
    [
        ({"priorty": 1}, TypeError),
        ({"headers": {"a": object()}}, (TypeError, ValueError)),
        ({"timeout": 0}, ValueError),
        ({"persistent": "yes"}, TypeError),
        ({"exchange": "x" * 256}, ValueError),
        ({"message_id": 5}, TypeError),
        ({"priority": 300}, ValueError),
    ],
)
def test_bad_options_fail_before_anything_is_sent(kw: dict[str, Any], err: Any) -> None:
    with pytest.raises(err):
        outgoing("q", b"x", **kw)


def test_a_reply_goes_to_reply_to_with_the_correlation_id() -> None:
    d: Any = SimpleNamespace(
        properties=SimpleNamespace(reply_to="rq", correlation_id="c1"), message_id="m1"
    )
    m = reply(d, {"ok": True})
    assert (m.exchange, m.routing_key, m.properties["correlation_id"]) == ("", "rq", "c1")
    d.properties.correlation_id = None
    assert reply(d, b"x").properties["correlation_id"] == "m1"
    assert reply(d, b"x", correlation_id="own").properties["correlation_id"] == "own"
    d.properties.reply_to = None
    with pytest.raises(ValueError, match="no reply_to"):
        reply(d, b"x")


@given(confirmed=st.booleans(), returned=st.booleans(), why=st.sampled_from(["", "timeout"]))
def test_the_outcome_rule(confirmed: bool, returned: bool, why: str) -> None:
    m = outgoing("q", b"x")
    e = failure(m, confirmed=confirmed, returned=returned, why=why)
    if why:
        assert isinstance(e, ackkit.errors.PublishNotConfirmed)
    elif returned:
        assert isinstance(e, ackkit.errors.MessageUnroutable)
    elif not confirmed:
        assert isinstance(e, ackkit.errors.PublishNacked)
    else:
        assert e is None
    assert e is None or isinstance(e, ackkit.errors.PublishError)


def test_every_public_error_is_named_by_its_public_name() -> None:
    """Dead letters' error-type header, logs and tracebacks say `ackkit.BadPayload`: the
    header value stays `ackkit.<Name>` (what 0.1 wrote, what DLQ filters match) now that
    the errors live in `ackkit.errors`."""
    errors = [getattr(ackkit.errors, n) for n in ackkit.errors.__all__]
    assert len(errors) >= 14
    for cls in errors:
        try:
            exc = cls("x")
        except TypeError:
            exc = cls()
        assert qualname(exc) == f"ackkit.{cls.__name__}", cls


def test_a_body_larger_than_any_broker_takes_fails_at_the_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("ackkit._messages.publish.MAX_BODY", 8)
    assert outgoing("q", b"12345678").body == b"12345678"
    with pytest.raises(ValueError, match="body of 9 bytes is larger than any RabbitMQ"):
        outgoing("q", b"123456789")


def test_message_id_is_new_by_default_and_none_sends_none() -> None:
    from ackkit._messages.publish import outgoing

    a, b = outgoing("q", b"x"), outgoing("q", b"x")
    assert (
        len(a.properties["message_id"]) == 32
        and a.properties["message_id"] != b.properties["message_id"]
    )
    assert "message_id" not in outgoing("q", b"x", message_id=None).properties
    assert outgoing("q", b"x", message_id="auto").properties["message_id"] == "auto"
    with pytest.raises(TypeError, match="message_id"):
        outgoing("q", b"x", message_id=5)  # type: ignore[arg-type]
