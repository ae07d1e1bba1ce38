"""pika: a delivery whose properties pika cannot decode still reaches ackkit.

pika decodes every frame in `Connection._read_frame`; a content header it
cannot read (a timestamp past year 9999 in the headers table, a table nested
deeper than the recursion limit) raises there and takes the whole connection
down, and the broker hands the same message first again after the reconnect.
`SafeSelectConnection` (a subclass, used only for ackkit's own connections)
catches that for content-header frames and hands pika a header whose
properties are what could be salvaged (`ackkit._connection.salvage`), marked with the reason:
ackkit then dead-letters the delivery (`ListenerCore.receive(unreadable=...)`).

pika reads a shortstr or a header name that is not UTF-8 as bytes rather than
failing; aio-pika cannot read such a message at all. To treat a message the
same on both runtimes, such properties count as unreadable here as well.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from typing import Any

import pika
import pika.data
import pika.frame
import pika.spec

from .._connection.salvage import FRAME_HEADER, LATEST_TIMESTAMP, Salvage, describe, salvage_header
from .._core import wire


class UnreadableProperties(pika.spec.BasicProperties):  # type: ignore[misc]
    """Properties salvaged from a content header pika could not read; `ackkit_unreadable`
    says why, `ackkit_raw_headers` holds the headers table's bytes when pika could not
    read it (the DLQ tools read what they can of it: `wire.lenient_table`)."""

    def __init__(self, reason: str, raw_headers: bytes | None = None, **fields: Any) -> None:
        super().__init__(**fields)
        self.ackkit_unreadable = reason
        self.ackkit_raw_headers = raw_headers


def _decode_table(raw: bytes) -> Mapping[str, Any]:
    table: dict[Any, Any] = pika.data.decode_table(raw, 0)[0]
    bad = _bytes_key(table)
    if bad is not None:
        raise ValueError(f"a header name is not UTF-8 ({bad!r})")
    return table


def _bytes_key(table: Mapping[Any, Any]) -> bytes | None:
    """The first header name (at any depth) that pika left as bytes: it was not UTF-8."""
    stack: list[Any] = [table]
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            for k, x in v.items():
                if isinstance(k, bytes):
                    return k
                if isinstance(x, (dict, list)):
                    stack.append(x)
        elif isinstance(v, list):
            stack.extend(x for x in v if isinstance(x, (dict, list)))
    return None


def _suspect(props: Any) -> bool:
    """Did pika read properties aio-pika could not: a shortstr property or a header name
    left as bytes (not UTF-8), a timestamp past year 9999? (Once per delivery: kept to
    one pass over the decoded attributes.)"""
    attrs = vars(props)
    for v in attrs.values():
        if type(v) is bytes:  # pika leaves a shortstr it cannot decode as bytes
            return True
    ts = attrs.get("timestamp")
    if type(ts) is int and ts > LATEST_TIMESTAMP:
        return True  # a datetime cannot hold it (aio-pika cannot read it at all)
    headers = attrs.get("headers")
    return bool(headers) and _bytes_key(headers) is not None


def salvaged_properties(payload: bytes, error: BaseException | None) -> tuple[int, Any]:
    """(body size, UnreadableProperties) for a content-header frame payload."""
    s: Salvage = salvage_header(payload, _decode_table)
    reason = s.reason or (describe(error) if error is not None else "unreadable properties")
    return s.body_size, UnreadableProperties(reason, s.raw_headers, **s.fields)


class SafeSelectConnection(pika.SelectConnection):  # type: ignore[misc]
    """The SelectConnection of every ackkit connection: an unreadable content header
    becomes salvaged, marked properties instead of failing the connection, and each
    readable delivery keeps its raw headers for its copies (`_keep_wire_headers`)."""

    def _read_frame(self) -> tuple[int, Any]:
        try:
            consumed, value = super()._read_frame()
        except Exception as exc:  # RecursionError, ValueError, OverflowError, struct.error
            salvaged = _salvage_frame(self._frame_buffer, exc)
            if salvaged is None:
                raise
            return salvaged
        if type(value) is pika.frame.Header:
            props = value.properties
            if _suspect(props):
                return _salvage_frame(self._frame_buffer, None) or (consumed, value)
            if props.headers:  # an empty table has nothing a copy could change
                _keep_wire_headers(props, self._frame_buffer, consumed)
        return consumed, value


def _keep_wire_headers(props: Any, buf: Any, consumed: int) -> None:
    """Keep the headers as they were on the wire (`props.wire_headers`, {name:
    wire.Field}), so that a copy can carry them byte for byte (pika decodes float
    and double headers as ints, and cannot encode some types at all)."""
    try:
        raw = wire.decode_properties(bytes(buf[19 : consumed - 1]))
        props.wire_headers = raw.get("headers")
    except (wire.EncodeError, IndexError, ValueError):  # pika decoded it: keep that
        pass


def _salvage_frame(buf: bytes, error: BaseException | None) -> tuple[int, Any] | None:
    try:
        ftype, channel, size = struct.unpack_from(">BHI", buf, 0)
    except struct.error:
        return None
    if ftype != FRAME_HEADER or len(buf) < 8 + size:
        return None
    try:
        body_size, props = salvaged_properties(bytes(buf[7 : 7 + size]), error)
    except ValueError:
        return None
    return 8 + size, pika.frame.Header(channel, body_size, props)


def unreadable(method: Any, props: Any) -> str | None:
    """Why this delivery (its basic.deliver / get-ok and properties) cannot be read, or None."""
    marked = getattr(props, "ackkit_unreadable", None)
    if marked is None and type(method.exchange) is str and type(method.routing_key) is str:
        return None  # the usual case, once per delivery
    why = [marked or ""]
    for name in ("exchange", "routing_key"):
        if isinstance(getattr(method, name, None), bytes):
            why.append(f"{name.replace('_', ' ')} is not UTF-8")
    text = "; ".join(w for w in why if w)
    return text or None


def text(value: Any) -> str:
    """An exchange or routing key as text (pika leaves one that is not UTF-8 as bytes)."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value or ""
