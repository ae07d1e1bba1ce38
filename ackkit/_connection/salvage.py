"""Reading a content header piece by piece when a client library could not read it whole.

Pure and stdlib-only; the pika and aiormq frame hooks (`_sync/_frames.py`,
`_async/_frames.py`) use it to salvage what they can of a delivery whose
properties their library failed to decode (a timestamp past year 9999, a field
table nested deeper than Python's recursion limit, a header name or a shortstr
property that is not UTF-8), so that the delivery still reaches ackkit and is
dead-lettered with a reason instead of killing the connection.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

# Basic class properties in flag order (bit 15 first), with their AMQP domain.
PROPERTIES: tuple[tuple[str, str], ...] = (
    ("content_type", "shortstr"),
    ("content_encoding", "shortstr"),
    ("headers", "table"),
    ("delivery_mode", "octet"),
    ("priority", "octet"),
    ("correlation_id", "shortstr"),
    ("reply_to", "shortstr"),
    ("expiration", "shortstr"),
    ("message_id", "shortstr"),
    ("timestamp", "timestamp"),
    ("type", "shortstr"),
    ("user_id", "shortstr"),
    ("app_id", "shortstr"),
    ("cluster_id", "shortstr"),
)

FRAME_METHOD, FRAME_HEADER = 1, 2
BASIC_DELIVER = (60, 60)
BASIC_GET_OK = (60, 71)
LATEST_TIMESTAMP = 253402300799  # 9999-12-31T23:59:59Z: what datetime can hold

TableDecoder = Callable[[bytes], Mapping[str, Any]]


@dataclass
class Salvage:
    """What could be read of a content header: the body size, readable properties, problems."""

    body_size: int
    fields: dict[str, Any] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    raw_headers: bytes | None = None
    """The headers table's bytes (with its size) when `decode_table` could not read it."""

    @property
    def reason(self) -> str:
        return "; ".join(self.problems)


def salvage_header(payload: bytes, decode_table: TableDecoder) -> Salvage:
    """Read a content-header frame payload property by property.

    A shortstr property that is not UTF-8 is left out (a problem), a timestamp is
    kept as seconds only when a datetime can hold it, the headers table is kept
    only when `decode_table` (the client library's own, given the table's bytes
    with their length prefix) reads it; whatever it raises is the problem.
    Raises ValueError only when not even the body size can be read.
    """
    if len(payload) < 12:
        raise ValueError("content header shorter than its fixed part")
    (body_size,) = struct.unpack_from(">Q", payload, 4)
    out = Salvage(body_size)
    pos = 12
    try:
        flags, word = 0, 0
        while True:
            (part,) = struct.unpack_from(">H", payload, pos)
            pos += 2
            flags |= part << (16 * word)
            word += 1
            if not part & 1:
                break
        for bit, (name, kind) in zip(range(15, 1, -1), PROPERTIES, strict=True):
            if not flags & (1 << bit):
                continue
            if kind == "shortstr":
                n = payload[pos]
                raw = payload[pos + 1 : pos + 1 + n]
                if len(raw) < n:
                    raise struct.error("shortstr past the end")
                pos += 1 + n
                try:
                    out.fields[name] = raw.decode("utf-8")
                except UnicodeDecodeError:
                    out.problems.append(f"property {name} is not UTF-8 ({_show(raw)})")
            elif kind == "octet":
                out.fields[name] = payload[pos]
                pos += 1
            elif kind == "timestamp":
                (ts,) = struct.unpack_from(">Q", payload, pos)
                pos += 8
                if ts <= LATEST_TIMESTAMP:
                    out.fields[name] = ts
                else:
                    out.problems.append(f"property timestamp {ts} is past year 9999")
            else:
                (n,) = struct.unpack_from(">I", payload, pos)
                raw = payload[pos : pos + 4 + n]
                if len(raw) < 4 + n:
                    raise struct.error("table past the end")
                pos += 4 + n
                try:
                    out.fields[name] = dict(decode_table(raw))
                except RecursionError:
                    out.problems.append("headers: a field table nested too deep to read")
                    out.raw_headers = raw
                except Exception as exc:
                    out.problems.append(f"headers: {describe(exc)}")
                    out.raw_headers = raw
    except (struct.error, IndexError):
        out.problems.append("properties truncated")
    return out


def describe(exc: BaseException) -> str:
    """An exception in a few words (its type and text, capped)."""
    if isinstance(exc, RecursionError):
        return "a field table nested too deep to read"
    if isinstance(exc, UnicodeDecodeError):  # pamqp: a header name
        return f"a header name is not UTF-8 ({_show(exc.object[exc.start : exc.end + 8])})"
    text = str(exc)
    if len(text) > 200:
        text = text[:200] + "..."
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _show(raw: bytes) -> str:
    return repr(raw[:32]) + ("..." if len(raw) > 32 else "")


def shortstrs_valid(payload: bytes, offset: int, count: int) -> tuple[list[str], list[str], int]:
    """Read `count` shortstrs from `offset`: their text (undecodable bytes replaced),
    the indexes of those that were not UTF-8, and the offset after them."""
    texts: list[str] = []
    bad: list[str] = []
    for i in range(count):
        n = payload[offset]
        raw = payload[offset + 1 : offset + 1 + n]
        offset += 1 + n
        try:
            texts.append(raw.decode("utf-8"))
        except UnicodeDecodeError:
            texts.append(raw.decode("utf-8", "replace"))
            bad.append(str(i))
    return texts, bad, offset


@dataclass(frozen=True)
class MethodInfo:
    """The parts of a basic.deliver / basic.get-ok that matter, read leniently."""

    delivery_tag: int
    redelivered: bool
    exchange: str
    routing_key: str
    consumer_tag: str = ""
    message_count: int = 0
    problems: tuple[str, ...] = ()


def read_delivery_method(payload: bytes) -> MethodInfo | None:
    """A basic.deliver or basic.get-ok method frame payload, shortstrs decoded leniently;
    None for any other method (or one too short to read)."""
    try:
        class_id, method_id = struct.unpack_from(">HH", payload, 0)
        if (class_id, method_id) == BASIC_DELIVER:
            (ctag,), _, pos = shortstrs_valid(payload, 4, 1)
            tag, bits = struct.unpack_from(">QB", payload, pos)
            (exchange, rk), bad, _ = shortstrs_valid(payload, pos + 9, 2)
            problems = [("exchange", "routing key")[int(i)] + " is not UTF-8" for i in bad]
            return MethodInfo(tag, bool(bits & 1), exchange, rk, ctag, 0, tuple(problems))
        if (class_id, method_id) == BASIC_GET_OK:
            tag, bits = struct.unpack_from(">QB", payload, 4)
            (exchange, rk), bad, pos = shortstrs_valid(payload, 13, 2)
            (count,) = struct.unpack_from(">I", payload, pos)
            problems = [("exchange", "routing key")[int(i)] + " is not UTF-8" for i in bad]
            return MethodInfo(tag, bool(bits & 1), exchange, rk, "", count, tuple(problems))
    except (struct.error, IndexError):
        return None
    return None
