"""AMQP 0-9-1 basic properties and field tables, as bytes (no client library).

Copies are encoded here, for every runtime, so that what a copy carries does not
depend on which client library decoded the original: pika turns float and double
header values into ints (its decoder calls int() on them) and cannot encode a
float at all; pamqp re-encodes a double as a single-precision float and every
integer in the smallest type that holds it, and cannot encode `bytes`.

A header value decoded here is a `Field`: its type octet and its encoded bytes,
written back verbatim. A runtime that can see the original's raw content header
(the pika runtime can) therefore keeps every original header byte for byte.
Values a client library decoded are encoded by type: bool 't', int 'I' (or 'l'
past 32 bits), float 'd' (a double: no precision lost), Decimal 'D', str 'S',
bytes 'S' (a long string is any octets), bytearray 'x', datetime 'T', dict 'F',
list/tuple 'A', None 'V'.
"""

from __future__ import annotations

import datetime as _dt
import decimal
import struct
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

PROPERTY_NAMES = (
    "content_type",
    "content_encoding",
    "headers",
    "delivery_mode",
    "priority",
    "correlation_id",
    "reply_to",
    "expiration",
    "message_id",
    "timestamp",
    "type",
    "user_id",
    "app_id",
    "cluster_id",
)
"""The basic properties in wire order (bit 15 of the flags word down)."""

FRAME_OVERHEAD = 7 + 12 + 1
"""A content header frame: frame header (7), class/weight/body size (12), frame end (1)."""

_OCTET = ("delivery_mode", "priority")


class EncodeError(ValueError):
    """A value that has no AMQP field encoding (or does not fit its type)."""


@dataclass(frozen=True, slots=True)
class Field:
    """An AMQP field value as it was on the wire: type octet + encoded value."""

    raw: bytes

    @property
    def kind(self) -> str:
        return chr(self.raw[0])

    def __repr__(self) -> str:
        return f"Field({self.kind!r}, {self.raw[1:65].hex()}{'...' if len(self.raw) > 65 else ''})"


# -- encoding ----------------------------------------------------------------


def _short(value: Any) -> bytes:
    b = value.encode("utf-8") if isinstance(value, str) else bytes(value)
    if len(b) > 255:
        raise EncodeError(f"short string of {len(b)} bytes (at most 255)")
    return bytes((len(b),)) + b


_PACK_LENGTH = struct.Struct(">I").pack
_PACK_INT = struct.Struct(">i").pack


def _long(b: bytes) -> bytes:
    if len(b) > 0xFFFFFFFF:
        raise EncodeError("long string over 4 GiB")
    return _PACK_LENGTH(len(b)) + b


def _stamp(value: Any) -> int:
    if isinstance(value, _dt.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=_dt.UTC)
        return int(value.timestamp())
    if isinstance(value, time.struct_time):
        import calendar

        return calendar.timegm(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise EncodeError(f"timestamp of type {type(value).__name__}")


def encode_value(value: Any) -> bytes:
    """One field value: its type octet and its encoding."""
    kind = type(value)  # the usual header values first (a copy's headers are encoded often)
    if kind is str:
        try:
            return b"S" + _long(value.encode("utf-8"))
        except UnicodeEncodeError as exc:
            raise EncodeError(f"text that is not valid Unicode: {exc.reason}") from None
    if kind is int and -(2**31) <= value < 2**31:
        return b"I" + _PACK_INT(value)
    if isinstance(value, Field):
        return value.raw
    if isinstance(value, bool):
        return b"t" + (b"\x01" if value else b"\x00")
    if isinstance(value, int):
        if -(2**31) <= value < 2**31:
            return b"I" + struct.pack(">i", value)
        if -(2**63) <= value < 2**63:
            return b"l" + struct.pack(">q", value)
        raise EncodeError(f"integer {value} does not fit 64 bits")
    if isinstance(value, float):
        return b"d" + struct.pack(">d", value)
    if isinstance(value, str):
        try:
            return b"S" + _long(value.encode("utf-8"))
        except UnicodeEncodeError as exc:
            raise EncodeError(f"text that is not valid Unicode: {exc.reason}") from None
    if isinstance(value, bytearray):
        return b"x" + _long(bytes(value))
    if isinstance(value, (bytes, memoryview)):
        return b"S" + _long(bytes(value))
    if isinstance(value, decimal.Decimal):
        sign, digits, exp = value.as_tuple()
        if not isinstance(exp, int) or not -255 <= exp <= 0:
            # a positive exponent: write the integer out (scale 0), if it fits
            if isinstance(exp, int) and exp > 0:
                return encode_value(decimal.Decimal(int(value)))
            raise EncodeError(f"decimal {value} has no AMQP encoding")
        raw = int("".join(map(str, digits)) or "0") * (-1 if sign else 1)
        if not -(2**31) <= raw < 2**31:
            raise EncodeError(f"decimal {value} does not fit 32 bits")
        return b"D" + struct.pack(">Bi", -exp, raw)
    if isinstance(value, (_dt.datetime, time.struct_time)):
        return b"T" + struct.pack(">Q", _stamp(value))
    if isinstance(value, Mapping):
        return b"F" + encode_table(value)
    if isinstance(value, (list, tuple)):
        return b"A" + _long(b"".join(encode_value(v) for v in value))
    if value is None:
        return b"V"
    raise EncodeError(f"no AMQP field type for {type(value).__name__}")


def encode_table(table: Mapping[Any, Any]) -> bytes:
    """A field table: its 4-octet size, then name (short string) and value per entry."""
    parts = []
    for k, v in table.items():
        if not isinstance(k, (str, bytes)):
            raise EncodeError(f"table key of type {type(k).__name__}")
        try:
            name = k.encode("utf-8") if isinstance(k, str) else bytes(k)
        except UnicodeEncodeError:
            raise EncodeError(f"table key {k!r:.60} is not valid Unicode") from None
        if len(name) > 255:
            raise EncodeError(f"short string of {len(name)} bytes (at most 255)")
        parts.append(bytes((len(name),)) + name)
        try:
            parts.append(encode_value(v))
        except EncodeError as exc:
            raise EncodeError(f"header {k!r:.60}: {exc}") from None
    return _long(b"".join(parts))


def encode_properties(props: Mapping[str, Any]) -> bytes:
    """The property flags and property list of a basic content header."""
    flags = 0
    out: list[bytes] = []
    for i, name in enumerate(PROPERTY_NAMES):
        v = props.get(name)
        if v is None:
            continue
        flags |= 1 << (15 - i)
        if name == "headers":
            out.append(encode_table(v))
        elif name in _OCTET:
            v = getattr(v, "value", v)  # an enum (aio-pika's DeliveryMode)
            if not isinstance(v, int) or not 0 <= v <= 255:
                raise EncodeError(f"{name} {v!r} is not an octet")
            out.append(bytes((v,)))
        elif name == "timestamp":
            ts = _stamp(v)
            if not 0 <= ts < 2**64:
                raise EncodeError(f"timestamp {ts} out of range")
            out.append(struct.pack(">Q", ts))
        else:
            if not isinstance(v, (str, bytes)):
                raise EncodeError(f"{name} of type {type(v).__name__}")
            try:
                out.append(_short(v))
            except UnicodeEncodeError:
                raise EncodeError(f"{name} is not valid Unicode") from None
    return struct.pack(">H", flags) + b"".join(out)


def header_frame_size(props: Mapping[str, Any]) -> int:
    """Bytes of the content header frame that carries `props`."""
    return FRAME_OVERHEAD + len(encode_properties(props))


# -- decoding ----------------------------------------------------------------

_FIXED = {
    "t": 1, "b": 1, "B": 1, "s": 2, "u": 2, "U": 2, "I": 4, "i": 4,
    "l": 8, "L": 8, "f": 4, "d": 8, "D": 5, "T": 8, "V": 0,
}  # fmt: skip


def _field_end(data: bytes, at: int) -> int:
    """Offset just past the field value whose type octet is at `at`."""
    kind = chr(data[at])
    at += 1
    if kind in _FIXED:
        end = at + _FIXED[kind]
    elif kind in "SxAF":
        (n,) = struct.unpack_from(">I", data, at)
        end = at + 4 + n
    else:
        raise EncodeError(f"unknown field type {kind!r}")
    if end > len(data):
        raise EncodeError("field runs past the end of the data")
    return end


def decode_table(data: bytes, at: int = 0) -> tuple[dict[str, Field], int]:
    """A field table as {name: Field} (each value kept as its bytes), and the end offset."""
    (n,) = struct.unpack_from(">I", data, at)
    at += 4
    end = at + n
    if end > len(data):
        raise EncodeError("table runs past the end of the data")
    out: dict[str, Field] = {}
    while at < end:
        klen = data[at]
        key = data[at + 1 : at + 1 + klen].decode("utf-8", "surrogateescape")
        at += 1 + klen
        vend = _field_end(data, at)
        out[key] = Field(bytes(data[at:vend]))
        at = vend
    return out, end


def decode_properties(data: bytes) -> dict[str, Any]:
    """The basic properties from a content header's property flags and list.

    Headers come back as {name: Field}; short strings as str (bytes when not UTF-8).
    """
    at = 0
    flags = 0
    word = 0
    while True:
        (part,) = struct.unpack_from(">H", data, at)
        at += 2
        flags |= (part & 0xFFFE) << (16 * word)
        word += 1
        if not part & 1:
            break
    out: dict[str, Any] = {}
    for i, name in enumerate(PROPERTY_NAMES):
        if not flags & (1 << (15 - i)):
            continue
        if name == "headers":
            out[name], at = decode_table(data, at)
        elif name in _OCTET:
            out[name] = data[at]
            at += 1
        elif name == "timestamp":
            (out[name],) = struct.unpack_from(">Q", data, at)
            at += 8
        else:
            n = data[at]
            raw = bytes(data[at + 1 : at + 1 + n])
            at += 1 + n
            try:
                out[name] = raw.decode("utf-8")
            except UnicodeDecodeError:
                out[name] = raw
    return out


# -- reading what can be read --------------------------------------------------

_LENIENT_DEPTH = 32
"""Tables and arrays nested deeper than this are not looked into (read as None)."""

_LATEST_TIMESTAMP = 253402300799  # 9999-12-31T23:59:59Z
_INTS = {"b": ">b", "B": ">B", "s": ">h", "u": ">H", "U": ">h", "I": ">i", "i": ">I"}
_INTS.update({"l": ">q", "L": ">Q"})


_FLOAT_KINDS = frozenset("dfAF")
"""Field types that hold a float or may hold one (double, float, array, table)."""


def exact_floats(headers: Mapping[str, Any], raw: Mapping[str, Any]) -> dict[str, Any]:
    """`headers` as a client decoded them, with their float and double values read again
    from `raw`, the same table as it was on the wire ({name: Field}): pika decodes
    those as ints (2.5 as 2, at any depth). Only the entries whose wire type is a
    float, a double, an array or a table are read again; the others stay as given.
    Never raises: what cannot be read again stays the client's value."""
    out = dict(headers)
    for name, field in raw.items():
        if not (isinstance(field, Field) and field.raw and name in out):
            continue
        if chr(field.raw[0]) not in _FLOAT_KINDS:
            continue
        try:
            exact = lenient_table(encode_table({name: field})).get(name)
        except Exception:  # an entry that does not encode again: the client's value
            continue
        out[name] = _with_floats(out[name], exact)
    return out


def _with_floats(value: Any, exact: Any) -> Any:
    """`value` with the floats of `exact` (the same value read from the wire)."""
    if isinstance(exact, float):
        return exact
    if isinstance(value, dict) and isinstance(exact, dict):
        return {k: _with_floats(v, exact.get(k)) for k, v in value.items()}
    if isinstance(value, list) and isinstance(exact, list) and len(value) == len(exact):
        return [_with_floats(a, b) for a, b in zip(value, exact, strict=True)]
    return value


def field_value(f: Field) -> Any:
    """A `Field`'s value as Python reads it (as `lenient_table` reads a table's values;
    None for one that cannot be read)."""
    try:
        return _lenient_value(f.raw, 0, len(f.raw), 0)[0]
    except _UNREADABLE:
        return None


def lenient_table(data: bytes) -> dict[str, Any]:
    """A field table (with its 4-octet size) read as far as it can be read, as Python
    values: what a client library refused whole (a timestamp past year 9999, a header
    name that is not UTF-8, a table nested too deep) still gives every entry that can
    be read. Names that are not UTF-8 keep their bytes as surrogate escapes, text that
    is not UTF-8 stays bytes, a timestamp is its seconds, a decimal a `Decimal`; an
    entry past one that cannot be read (an unknown type) is left out. Never raises."""
    try:
        data = bytes(data)
        return _lenient_table(data, 0, len(data), 0)
    except Exception:  # a size field past the end, ...: nothing readable
        return {}


_UNREADABLE = (EncodeError, struct.error, IndexError, ValueError, OverflowError)


def _lenient_table(data: bytes, at: int, limit: int, depth: int) -> dict[str, Any]:
    (n,) = struct.unpack_from(">I", data, at)
    at += 4
    end = min(at + n, limit)
    out: dict[str, Any] = {}
    while at < end:
        klen = data[at]
        key = data[at + 1 : at + 1 + klen].decode("utf-8", "surrogateescape")
        at += 1 + klen
        try:
            out[key], at = _lenient_value(data, at, end, depth)
        except _UNREADABLE:
            break
    return out


def _lenient_value(data: bytes, at: int, limit: int, depth: int) -> tuple[Any, int]:
    """The value whose type octet is at `at` (nothing read past `limit`), and its end."""
    kind = chr(data[at])
    vend = _field_end(data, at)
    if vend > limit:
        raise EncodeError("field runs past its table")
    body = data[at + 1 : vend]
    if kind in _INTS:
        return struct.unpack(_INTS[kind], body)[0], vend
    if kind == "t":
        return body != b"\x00", vend
    if kind in "fd":
        return struct.unpack(">f" if kind == "f" else ">d", body)[0], vend
    if kind == "T":
        (ts,) = struct.unpack(">Q", body)
        if ts <= _LATEST_TIMESTAMP:
            return _dt.datetime.fromtimestamp(ts, _dt.UTC), vend
        return ts, vend  # past year 9999: a datetime cannot hold it
    if kind == "D":
        scale, raw = struct.unpack(">Bi", body)
        return decimal.Decimal(raw).scaleb(-scale), vend
    if kind == "V":
        return None, vend
    if kind in "Sx":
        raw = body[4:]
        if kind == "x":
            return raw, vend
        try:
            return raw.decode("utf-8"), vend
        except UnicodeDecodeError:
            return raw, vend
    if depth >= _LENIENT_DEPTH:
        return None, vend
    if kind == "F":
        return _lenient_table(data, at + 1, vend, depth + 1), vend
    items: list[Any] = []  # "A"
    pos = at + 5
    while pos < vend:
        try:
            v, pos = _lenient_value(data, pos, vend, depth + 1)
        except _UNREADABLE:
            break
        items.append(v)
    return items, vend
