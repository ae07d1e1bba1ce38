"""An AMQP 1.0 message as AMQP 0-9-1's properties and body, and back.

The runtime, the core and the handlers know a delivery by 0-9-1's basic properties
(`Delivery.properties`, its headers, its message id). A message that came over AMQP
1.0 is mapped to them as RabbitMQ 4.x maps it for a 0-9-1 consumer, and a message
ackkit publishes over AMQP 1.0 (a copy, a handler's publish) is mapped back the same
way, so that either protocol may be on either side:

- the body: the data sections, joined; a string amqp-value as its UTF-8 bytes;
  any other amqp-value is not a body a handler can be given (`Unreadable`);
- `content_type`, `content_encoding`, `correlation_id`, `message_id`, `user_id`: the
  properties of the same name (ids as text);
- `headers`: the application properties, and the message annotations whose names
  start with ``x-`` (RabbitMQ's own, e.g. ``x-opt-deaths``); back, an ``x-`` header is an
  annotation, the others application properties;
- `delivery_mode` 2: `durable`; `priority`; `expiration` (milliseconds): `ttl`;
  `timestamp` (seconds): `creation-time`; `reply_to` "q": ``/queues/q``; `type` and
  `app_id`: the annotations ``x-basic-type`` and ``x-basic-app-id``;
- the exchange and routing key a message was published to: the annotations
  ``x-exchange`` and ``x-routing-key``.

Values: AMQP 1.0 symbols, chars and uuids become text, timestamps datetimes, arrays
lists, described values their value; a decimal (which 0-9-1 headers cannot carry as
it is) its text.
"""

from __future__ import annotations

import datetime as _dt
import urllib.parse
import uuid
from collections.abc import Mapping
from typing import Any

import pika.spec
from proton import Array, Data, Described, Message, symbol, timestamp

from .._core import wire

_EPOCH = _dt.datetime(1970, 1, 1, tzinfo=_dt.UTC)
_MS = _dt.timedelta(milliseconds=1)
_SKIP = frozenset({"x-exchange", "x-routing-key", "x-basic-type", "x-basic-app-id"})
_DEPTH = 32


class Unreadable(ValueError):
    """A message whose body cannot be handed to a handler as bytes: `body` holds its
    encoded section, so a dead-letter copy still carries it whole."""

    def __init__(self, why: str, body: bytes) -> None:
        super().__init__(why)
        self.body = body


def address(exchange: str, routing_key: str) -> str:
    """The AMQP 1.0 address (RabbitMQ 4.x's v2 form) of a 0-9-1 publish's target."""
    q = urllib.parse.quote
    if not exchange:
        return f"/queues/{q(routing_key, safe='')}"
    if not routing_key:
        return f"/exchanges/{q(exchange, safe='')}"
    return f"/exchanges/{q(exchange, safe='')}/{q(routing_key, safe='')}"


def queue_address(queue: str) -> str:
    """The address a receiver link consumes `queue` from."""
    return address("", queue)


def plain(value: Any, depth: int = 0) -> Any:
    """An AMQP 1.0 value as a value a 0-9-1 header can carry."""
    if depth > _DEPTH:
        return None
    if value is None or isinstance(value, (bool, bytes)):
        return value
    if isinstance(value, timestamp):  # an int subclass: before int
        return _EPOCH + int(value) * _MS
    if isinstance(value, int):  # int32, ulong, ...: plain ints, as ackkit's checks expect
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, str):  # symbol, char
        return str(value)
    if isinstance(value, memoryview):
        return bytes(value)
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, Described):
        return plain(value.value, depth + 1)
    if isinstance(value, Array):
        return [plain(v, depth + 1) for v in value.elements]
    if isinstance(value, (list, tuple)):
        return [plain(v, depth + 1) for v in value]
    if isinstance(value, dict):
        return {str(k): plain(v, depth + 1) for k, v in value.items()}
    return str(value)  # decimal32/64/128 and anything newer: its text


def _symbol(value: Any) -> str | None:
    """A symbol property's text (proton 0.40 reads an absent one as the symbol 'None')."""
    if value is None or value == "None":
        return None
    return str(value)


def _text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, (bytes, memoryview)):
        return bytes(value).decode("utf-8", "replace")
    return str(value)


def body_of(msg: Message) -> bytes:
    """The body a handler gets (raises `Unreadable` for an amqp-value it cannot)."""
    body = msg.body
    if body is None:
        return b""
    if isinstance(body, (bytes, memoryview)):
        return bytes(body)
    if isinstance(body, str):
        return body.encode("utf-8")
    if (
        isinstance(body, list)
        and msg.inferred
        and all(isinstance(b, (bytes, memoryview)) for b in body)
    ):
        return b"".join(bytes(b) for b in body)
    d = Data()
    d.put_object(body)
    raise Unreadable(
        f"its body is an AMQP 1.0 amqp-value of type {type(body).__name__}, not bytes",
        b"\x00Sw" + bytes(d.encode()),  # the amqp-value section, as RabbitMQ hands it to 0-9-1
    )


def properties_of(msg: Message) -> tuple[pika.spec.BasicProperties, str, str]:
    """(0-9-1 properties, exchange, routing key) of a message received over AMQP 1.0."""
    ann: dict[Any, Any] = msg.annotations or {}
    headers: dict[str, Any] = {}
    if msg.properties:
        for k, v in msg.properties.items():
            headers[str(k)] = plain(v)
    for k, v in ann.items():
        name = str(k)
        if name.startswith("x-") and name not in _SKIP:
            headers[name] = plain(v)
    reply_to = _text(msg.reply_to)
    if reply_to and reply_to.startswith("/queues/"):
        reply_to = urllib.parse.unquote(reply_to[len("/queues/") :])
    ttl = msg.ttl
    created = msg.creation_time
    props = pika.spec.BasicProperties(
        content_type=_symbol(msg.content_type),
        content_encoding=_symbol(msg.content_encoding),
        headers=headers or None,
        delivery_mode=2 if msg.durable else 1,
        priority=None if msg.priority == 4 else msg.priority,
        correlation_id=_text(msg.correlation_id),
        reply_to=reply_to,
        expiration=str(int(ttl * 1000)) if ttl else None,
        message_id=_text(msg.id),
        timestamp=int(created) if created else None,
        type=_text(ann.get(symbol("x-basic-type"))),
        user_id=_text(msg.user_id) or None,
        app_id=_text(ann.get(symbol("x-basic-app-id"))),
    )
    return (
        props,
        _text(ann.get(symbol("x-exchange"))) or "",
        _text(ann.get(symbol("x-routing-key"))) or "",
    )


def _value(v: Any) -> Any:
    """A 0-9-1 header value (a `wire.Field` when kept as it was on the wire) as proton
    encodes it."""
    if isinstance(v, wire.Field):
        v = wire.field_value(v)
    if isinstance(v, _dt.datetime):
        aware = v if v.tzinfo is not None else v.replace(tzinfo=_dt.UTC)
        return timestamp((aware - _EPOCH) // _MS)
    if isinstance(v, (bytearray, memoryview)):
        return bytes(v)
    if isinstance(v, dict):
        return {str(k): _value(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_value(x) for x in v]
    if v is None or isinstance(v, (bool, int, float, str, bytes)):
        return v
    return str(v)  # Decimal: its text


def message_of(props: Mapping[str, Any], body: bytes, exchange: str, routing_key: str) -> Message:
    """The AMQP 1.0 message for a 0-9-1 publish of `body` with `props` (AMQP property
    name -> value) to `exchange` with `routing_key`."""
    msg = Message(body=bytes(body), inferred=True)
    msg.address = address(exchange, routing_key)
    app: dict[str, Any] = {}
    ann: dict[Any, Any] = {}
    for k, v in (props.get("headers") or {}).items():
        if k.startswith("x-"):
            ann[symbol(k)] = _value(v)
        else:
            app[k] = _value(v)
    if app:
        msg.properties = app  # type: ignore[assignment]  # proton's stub says None
    ct, ce = props.get("content_type"), props.get("content_encoding")
    if ct:
        msg.content_type = symbol(ct)
    if ce:
        msg.content_encoding = symbol(ce)
    msg.durable = props.get("delivery_mode") == 2
    if props.get("priority") is not None:
        msg.priority = int(props["priority"])
    for name, attr in (("correlation_id", "correlation_id"), ("message_id", "id")):
        if props.get(name) is not None:
            setattr(msg, attr, _text(props[name]))
    if props.get("reply_to"):
        rt = _text(props["reply_to"]) or ""
        msg.reply_to = rt if rt.startswith("/") else address("", rt)
    exp = props.get("expiration")
    if exp and str(exp).isdigit():  # else the broker would refuse it over 0-9-1 too
        msg.ttl = int(exp) / 1000
    if props.get("timestamp") is not None:
        ts = props["timestamp"]
        msg.creation_time = ts.timestamp() if isinstance(ts, _dt.datetime) else float(ts)
    if props.get("user_id"):
        msg.user_id = (_text(props["user_id"]) or "").encode("utf-8")
    if props.get("type"):
        ann[symbol("x-basic-type")] = _text(props["type"])
    if props.get("app_id"):
        ann[symbol("x-basic-app-id")] = _text(props["app_id"])
    if ann:
        msg.annotations = ann
    return msg
