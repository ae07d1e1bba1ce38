"""A raw AMQP 0-9-1 client for tests: put any bytes into a content header, read them back.

Standard library only, one file, on purpose: tests use it to publish what no client
library would let them build (invalid UTF-8 in a header key, a timestamp past year
9999, a field table nested thousands deep, an unknown type tag, a truncated table)
and to read back the exact bytes of a content header a message carries, for
byte-for-byte comparisons. It is a test tool, not a client: one channel, no
heartbeats, blocking sockets, every error raised.

    with RawClient("amqp://guest:guest@127.0.0.1:5672/%2f") as c:
        c.publish("", "q", b"body", {"message_id": b"\\xff", "headers": {"a": 1}})
        c.publish("", "q", b"x", {}, raw_headers_table_bytes=nested_table(5000))
        got = c.get("q")          # got.header: the raw content-header payload
        props = parse_properties(got.header)

Field values: Python values map to a type tag (`encode_value`); pick the tag
yourself with `Field(tag, value)`, or write bytes as they are with `Raw(b"...")`
(the type tag included), which is how invalid pieces get into a table.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import decimal
import socket
import struct
import urllib.parse
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

FRAME_METHOD, FRAME_HEADER, FRAME_BODY, FRAME_HEARTBEAT = 1, 2, 3, 8
FRAME_END = b"\xce"
PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
BASIC = 60

# Basic class properties, in flag order (bit 15 first) with their AMQP domain.
PROPERTIES: list[tuple[str, str]] = [
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
]


class AMQPError(Exception):
    """The broker closed the channel or the connection (code, text, class, method)."""

    def __init__(self, what: str, code: int, text: str, class_id: int, method_id: int):
        super().__init__(f"{what} closed by broker: {code} {text} (on {class_id}.{method_id})")
        self.code = code
        self.text = text


# -- encoding ----------------------------------------------------------------


@dataclass(frozen=True)
class Field:
    """A field value with the type tag chosen by the test (one of `TAGS`)."""

    tag: str
    value: Any = None


@dataclass(frozen=True)
class Raw:
    """Bytes written into a table or array as they are: type tag and value."""

    data: bytes


# Every field type RabbitMQ knows (its own reading of 0-9-1's table, with errata):
# tag -> struct format for the fixed-size ones.
_FIXED = {
    "t": "B",  # boolean, one octet
    "b": "b",  # signed 8
    "B": "B",  # unsigned 8
    "s": "h",  # signed 16 (RabbitMQ's 's' is a short int, not a short string)
    "u": "H",  # unsigned 16
    "I": "i",  # signed 32
    "i": "I",  # unsigned 32
    "L": "q",  # signed 64 (RabbitMQ reads 'l' as signed 64 as well)
    "l": "q",  # signed 64
    "f": "f",  # float
    "d": "d",  # double
    "T": "Q",  # timestamp, seconds since the epoch, unsigned 64
}
TAGS = "tbBsuIiLlfdDSATFVx"


def shortstr(s: str | bytes) -> bytes:
    """A short string: length octet, then the bytes (str is UTF-8 encoded; bytes as is)."""
    b = s.encode() if isinstance(s, str) else s
    if len(b) > 255:
        raise ValueError("shortstr longer than 255 bytes")
    return bytes([len(b)]) + b


def longstr(s: str | bytes) -> bytes:
    b = s.encode() if isinstance(s, str) else s
    return struct.pack(">I", len(b)) + b


def encode_field(tag: str, value: Any) -> bytes:
    """One field value with the given type tag: the tag octet, then the value."""
    t = tag.encode("latin-1")
    if tag in _FIXED:
        if tag == "t":
            value = 1 if value else 0
        if tag == "T" and isinstance(value, _dt.datetime):
            value = int(value.timestamp())
        return t + struct.pack(">" + _FIXED[tag], value)
    if tag == "D":  # decimal: scale octet, then a signed 32 bit unscaled value
        if isinstance(value, decimal.Decimal):
            _sign, _digits, exp = value.as_tuple()
            scale = -int(exp) if isinstance(exp, int) and exp < 0 else 0
            unscaled = int(value.scaleb(scale))
            return t + struct.pack(">Bi", scale, unscaled)
        scale, unscaled = value
        return t + struct.pack(">Bi", scale, unscaled)
    if tag in ("S", "x"):
        return t + longstr(value)
    if tag == "A":
        return t + encode_array(value)
    if tag == "F":
        return t + (value if isinstance(value, bytes) else encode_table(value))
    if tag == "V":
        return t
    raise ValueError(f"unknown field type tag {tag!r}")


def encode_value(value: Any) -> bytes:
    """A Python value as a field value, with the tag a client would pick."""
    if isinstance(value, Raw):
        return value.data
    if isinstance(value, Field):
        return encode_field(value.tag, value.value)
    if value is None:
        return b"V"
    if isinstance(value, bool):
        return encode_field("t", value)
    if isinstance(value, int):
        return encode_field("I" if -(2**31) <= value < 2**31 else "l", value)
    if isinstance(value, float):
        return encode_field("d", value)
    if isinstance(value, decimal.Decimal):
        return encode_field("D", value)
    if isinstance(value, (str, bytes)):
        return encode_field("S", value)
    if isinstance(value, _dt.datetime):
        return encode_field("T", value)
    if isinstance(value, Mapping):
        return encode_field("F", value)
    if isinstance(value, (list, tuple)):
        return encode_field("A", value)
    raise TypeError(f"no AMQP field type for {type(value).__name__}")


def encode_table(table: Mapping[str | bytes, Any]) -> bytes:
    """A field table: a 32 bit byte count, then (shortstr key, field value) pairs.

    Keys may be bytes (written as they are, e.g. invalid UTF-8).
    """
    body = b"".join(shortstr(k) + encode_value(v) for k, v in table.items())
    return struct.pack(">I", len(body)) + body


def encode_array(values: Any) -> bytes:
    body = b"".join(encode_value(v) for v in values)
    return struct.pack(">I", len(body)) + body


def nested_table(depth: int, leaf: Mapping[str | bytes, Any] | None = None) -> bytes:
    """A table nested `depth` levels deep ({"n": {"n": ...}}), built without recursion."""
    inner = encode_table(leaf or {})
    for _ in range(depth):
        pair = shortstr("n") + b"F" + inner
        inner = struct.pack(">I", len(pair)) + pair
    return inner


def encode_properties(
    fields: Mapping[str, Any], raw_headers_table_bytes: bytes | None = None
) -> bytes:
    """Property flags and property list of a basic content header.

    Shortstr properties may be given as bytes (written as they are). The headers
    table is `fields["headers"]` encoded, or `raw_headers_table_bytes` verbatim
    (the 32 bit length included).
    """
    known = {name for name, _ in PROPERTIES}
    unknown = set(fields) - known
    if unknown:
        raise ValueError(f"unknown basic properties: {sorted(unknown)}")
    flags = 0
    out = b""
    for bit, (name, kind) in zip(range(15, 1, -1), PROPERTIES, strict=True):
        if name == "headers" and raw_headers_table_bytes is not None:
            flags |= 1 << bit
            out += raw_headers_table_bytes
            continue
        if fields.get(name) is None:
            continue
        flags |= 1 << bit
        v = fields[name]
        if kind == "shortstr":
            out += shortstr(v)
        elif kind == "octet":
            out += struct.pack(">B", v)
        elif kind == "timestamp":
            out += struct.pack(">Q", int(v.timestamp()) if isinstance(v, _dt.datetime) else v)
        else:
            out += v if isinstance(v, bytes) else encode_table(v)
    return struct.pack(">H", flags) + out


# -- decoding (only what a test needs to look at) ---------------------------


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def take(self, n: int) -> bytes:
        if self.pos + n > len(self.data):
            raise ValueError("truncated")
        b = self.data[self.pos : self.pos + n]
        self.pos += n
        return b

    def unpack(self, fmt: str) -> Any:
        (v,) = struct.unpack(">" + fmt, self.take(struct.calcsize(">" + fmt)))
        return v

    def shortstr(self) -> bytes:
        return self.take(self.unpack("B"))

    def longstr(self) -> bytes:
        return self.take(self.unpack("I"))


def parse_properties(header: bytes) -> dict[str, Any]:
    """The properties of a raw content-header payload, the headers table left as bytes.

    Shortstrs stay bytes, so a test can compare them whatever they hold.
    """
    r = _Reader(header)
    r.unpack("H")  # class id
    r.unpack("H")  # weight
    r.unpack("Q")  # body size
    flags = r.unpack("H")
    out: dict[str, Any] = {}
    for bit, (name, kind) in zip(range(15, 1, -1), PROPERTIES, strict=True):
        if not flags & (1 << bit):
            continue
        if kind == "shortstr":
            out[name] = r.shortstr()
        elif kind == "octet":
            out[name] = r.unpack("B")
        elif kind == "timestamp":
            out[name] = r.unpack("Q")
        else:
            start = r.pos
            r.longstr()
            out[name] = r.data[start : r.pos]
    return out


# -- the connection ----------------------------------------------------------


@dataclass
class GetResult:
    """A basic.get-ok: the raw content-header payload and the body."""

    delivery_tag: int
    redelivered: bool
    exchange: str
    routing_key: str
    message_count: int
    header: bytes  # class id, weight, body size, flags, property list: as on the wire
    body: bytes
    properties: dict[str, Any] = field(default_factory=dict)  # parse_properties(header)


def _method(class_id: int, method_id: int, args: bytes = b"") -> bytes:
    return struct.pack(">HH", class_id, method_id) + args


class RawClient:
    """One connection, one channel (1), publisher confirms on by default."""

    def __init__(self, url: str, *, confirm: bool = True, timeout: float = 10.0) -> None:
        u = urllib.parse.urlparse(url)
        self.vhost = urllib.parse.unquote(u.path[1:]) if len(u.path) > 1 else "/"
        self.sock = socket.create_connection((u.hostname or "localhost", u.port or 5672), timeout)
        self.buf = b""
        self.frame_max = 131072
        self.published = 0
        self.confirm = confirm
        user = urllib.parse.unquote(u.username or "guest")
        password = urllib.parse.unquote(u.password or "guest")
        self._handshake(user, password)
        if confirm:
            self._call(_method(85, 10, b"\x00"), (85, 11))

    # frames

    def _send(self, ftype: int, channel: int, payload: bytes) -> None:
        self.sock.sendall(struct.pack(">BHI", ftype, channel, len(payload)) + payload + FRAME_END)

    def _recv(self, n: int) -> bytes:
        while len(self.buf) < n:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("connection closed by broker")
            self.buf += chunk
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def frames(self) -> Iterator[tuple[int, int, bytes]]:
        """Frames as they arrive (heartbeats skipped)."""
        while True:
            ftype, channel, size = struct.unpack(">BHI", self._recv(7))
            payload = self._recv(size)
            if self._recv(1) != FRAME_END:
                raise ValueError("bad frame end")
            if ftype != FRAME_HEARTBEAT:
                yield ftype, channel, payload

    def _read_method(self) -> tuple[int, int, _Reader]:
        ftype, _channel, payload = next(self.frames())
        if ftype != FRAME_METHOD:
            raise ValueError(f"expected a method frame, got type {ftype}")
        r = _Reader(payload)
        cid, mid = r.unpack("H"), r.unpack("H")
        if (cid, mid) in ((10, 50), (20, 40)):
            code, text = r.unpack("H"), r.shortstr().decode(errors="replace")
            ccid, cmid = r.unpack("H"), r.unpack("H")
            if cid == 10:
                self._send(FRAME_METHOD, 0, _method(10, 51))
                self.sock.close()
                raise AMQPError("connection", code, text, ccid, cmid)
            self._send(FRAME_METHOD, 1, _method(20, 41))
            self._open_channel()  # keep the client usable after a channel error
            raise AMQPError("channel", code, text, ccid, cmid)
        return cid, mid, r

    def _call(self, payload: bytes, reply: tuple[int, int], channel: int = 1) -> _Reader:
        self._send(FRAME_METHOD, channel, payload)
        while True:
            cid, mid, r = self._read_method()
            if (cid, mid) == reply:
                return r

    def _handshake(self, user: str, password: str) -> None:
        self.sock.sendall(PROTOCOL_HEADER)
        cid, mid, _ = self._read_method()
        assert (cid, mid) == (10, 10), "expected connection.start"
        props = encode_table({"product": "rawamqp (ackkit tests)"})
        response = b"\x00" + user.encode() + b"\x00" + password.encode()
        self._send(
            FRAME_METHOD,
            0,
            _method(10, 11, props + shortstr("PLAIN") + longstr(response) + shortstr("en_US")),
        )
        cid, mid, r = self._read_method()
        assert (cid, mid) == (10, 30), "expected connection.tune"
        channel_max, frame_max, _heartbeat = r.unpack("H"), r.unpack("I"), r.unpack("H")
        self.frame_max = frame_max or self.frame_max
        self._send(
            FRAME_METHOD, 0, _method(10, 31, struct.pack(">HIH", channel_max, self.frame_max, 0))
        )
        self._call(_method(10, 40, shortstr(self.vhost) + shortstr("") + b"\x00"), (10, 41), 0)
        self._open_channel()

    def _open_channel(self) -> None:
        self._call(_method(20, 10, shortstr("")), (20, 11))
        if getattr(self, "confirm", False):
            self.published = 0
            self._call(_method(85, 10, b"\x00"), (85, 11))

    # operations

    def publish(
        self,
        exchange: str,
        routing_key: str,
        body: bytes,
        properties: bytes | Mapping[str, Any] | None = None,
        *,
        raw_headers_table_bytes: bytes | None = None,
    ) -> None:
        """Publish; with confirms on, wait for the broker's ack (raise on nack).

        `properties`: a mapping of basic properties (see `encode_properties`) or the
        raw bytes of property flags plus property list, sent as they are.
        """
        if isinstance(properties, bytes):
            if raw_headers_table_bytes is not None:
                raise ValueError("raw properties already hold the headers table")
            props = properties
        else:
            props = encode_properties(properties or {}, raw_headers_table_bytes)
        self.publish_raw_header(exchange, routing_key, body, props)

    def publish_raw_header(
        self,
        exchange: str,
        routing_key: str,
        body: bytes,
        props: bytes,
        body_size: int | None = None,
    ) -> None:
        """Publish with `props` as the content header's flags-and-properties bytes.

        `body_size` may differ from len(body) (the broker will then refuse it).
        """
        size = len(body) if body_size is None else body_size
        self._send(
            FRAME_METHOD,
            1,
            _method(BASIC, 40, b"\x00\x00" + shortstr(exchange) + shortstr(routing_key) + b"\x00"),
        )
        self._send(FRAME_HEADER, 1, struct.pack(">HHQ", BASIC, 0, size) + props)
        step = self.frame_max - 8
        for i in range(0, len(body), step):
            self._send(FRAME_BODY, 1, body[i : i + step])
        if not self.confirm:
            return
        self.published += 1
        while True:
            cid, mid, r = self._read_method()
            if cid != BASIC:
                continue
            if mid == 50:  # basic.return: skip its header and body
                self._read_content()
            elif mid in (80, 120):
                tag, bits = r.unpack("Q"), r.unpack("B")
                if tag == self.published or (bits & 1 and tag >= self.published):
                    if mid == 120:
                        raise AMQPError("publish", 0, "nacked by broker", BASIC, 40)
                    return

    def _read_content(self) -> tuple[bytes, bytes]:
        frames = self.frames()
        ftype, _, header = next(frames)
        if ftype != FRAME_HEADER:
            raise ValueError(f"expected a content header, got frame type {ftype}")
        (size,) = struct.unpack(">Q", header[4:12])
        body = b""
        while len(body) < size:
            ftype, _, chunk = next(frames)
            if ftype != FRAME_BODY:
                raise ValueError(f"expected a body frame, got type {ftype}")
            body += chunk
        return header, body

    def get(self, queue: str, *, no_ack: bool = True) -> GetResult | None:
        """basic.get: the message with its raw content header, or None if the queue is empty.

        With no_ack=False, settle it with `ack(tag)` / `reject(tag, requeue)`.
        """
        self._send(
            FRAME_METHOD, 1, _method(BASIC, 70, b"\x00\x00" + shortstr(queue) + bytes([no_ack]))
        )
        while True:
            cid, mid, r = self._read_method()
            if (cid, mid) == (BASIC, 72):
                return None
            if (cid, mid) == (BASIC, 71):
                break
        tag, redelivered = r.unpack("Q"), bool(r.unpack("B") & 1)
        exchange, rk = r.shortstr().decode(), r.shortstr().decode()
        count = r.unpack("I")
        header, body = self._read_content()
        return GetResult(
            tag, redelivered, exchange, rk, count, header, body, parse_properties(header)
        )

    def get_all(self, queue: str) -> list[GetResult]:
        """Take every message in `queue` (auto-ack), in order."""
        out = []
        while (m := self.get(queue)) is not None:
            out.append(m)
        return out

    def ack(self, tag: int) -> None:
        self._send(FRAME_METHOD, 1, _method(BASIC, 80, struct.pack(">QB", tag, 0)))

    def reject(self, tag: int, requeue: bool) -> None:
        self._send(FRAME_METHOD, 1, _method(BASIC, 90, struct.pack(">QB", tag, int(requeue))))

    def queue_declare(self, queue: str, arguments: Mapping[str, Any] | None = None) -> int:
        """Declare a durable queue; returns its message count."""
        args = shortstr(queue) + b"\x02" + encode_table(arguments or {})  # bits: durable
        r = self._call(_method(50, 10, b"\x00\x00" + args), (50, 11))
        r.shortstr()
        return int(r.unpack("I"))

    def queue_delete(self, queue: str) -> None:
        self._call(_method(50, 40, b"\x00\x00" + shortstr(queue) + b"\x00"), (50, 41))

    def close(self) -> None:
        with contextlib.suppress(OSError, ConnectionError, AMQPError):
            self._call(
                _method(10, 50, struct.pack(">H", 200) + shortstr("bye") + b"\x00" * 4), (10, 51), 0
            )
        self.sock.close()

    def __enter__(self) -> RawClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
