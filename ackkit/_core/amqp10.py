"""An AMQP 1.0 message's parts, read from its encoded bytes: what a stream record holds
(the rabbitmq-stream Spark source's rows), and what the AMQP 1.0 runtime salvages of a
delivery proton could not decode (`ackkit._amqp10.channel`).

RabbitMQ keeps each stream record as an encoded AMQP 1.0 message: sections, each a
described value (0x00, the small-ulong descriptor 0x53 and the section's code, then the
value). `read` takes what a row shows: the message-id and the content-type (fields 1
and 7 of the properties list), the application properties, and the body: the data
sections joined in order (AMQP 1.0's definition of the body), or else the amqp-value,
or the amqp-sequence sections. It steps over the other sections (header, annotations,
footer) and the other properties by their encoded sizes, without decoding them: about
a quarter of the time of a general decoder.

Values: null is None; booleans, integers (a timestamp as milliseconds) and floats as
themselves; a uuid as `uuid.UUID`; strings and symbols as `str` (bytes that are not
UTF-8 replaced); binary as `bytes`; lists and arrays as lists, maps as dicts; a
described value as its value; a char as a one-character str (U+FFFD for a code point
that is no character); a decimal as its encoded bytes.

`read` returns None for bytes that are not such a message: a section not described by a
small ulong, an unknown constructor, a size or a count that runs past its end (or a
count larger than its size in bytes), items that do not end where their size says,
values nested more than 32 deep. It never raises, and nothing is allocated ahead of
the bytes that hold it: a hostile size or count costs no more than the record's length.
"""

from __future__ import annotations

import struct
import uuid
from typing import Any, NamedTuple

_U16 = struct.Struct(">H").unpack_from
_I16 = struct.Struct(">h").unpack_from
_U32 = struct.Struct(">I").unpack_from
_I32 = struct.Struct(">i").unpack_from
_U64 = struct.Struct(">Q").unpack_from
_I64 = struct.Struct(">q").unpack_from
_I8 = struct.Struct(">b").unpack_from
_F32 = struct.Struct(">f").unpack_from
_F64 = struct.Struct(">d").unpack_from

# Section codes (the small-ulong descriptors of AMQP 1.0's message format).
_HEADER, _DELIVERY_ANN, _MESSAGE_ANN, _PROPERTIES, _APP_PROPS = 0x70, 0x71, 0x72, 0x73, 0x74
_DATA, _SEQUENCE, _VALUE, _FOOTER = 0x75, 0x76, 0x77, 0x78
_STEPPED_OVER = frozenset((_HEADER, _DELIVERY_ANN, _MESSAGE_ANN, _FOOTER))
_DEPTH = 32

# How a value's size follows its constructor: n >= 0 a fixed width, _V8 / _V32 a one- or
# four-byte size first; None: not a constructor (0x00, a described value, is apart).
_V8, _V32 = -1, -4
_WIDTH: list[int | None] = [None] * 256
for _c in range(0x40, 0x46):
    _WIDTH[_c] = 0
for _c in range(0x50, 0x57):
    _WIDTH[_c] = 1
for _c, _w in ((0x60, 2), (0x61, 2), (0x94, 16), (0x98, 16)):
    _WIDTH[_c] = _w
for _c in range(0x70, 0x75):
    _WIDTH[_c] = 4
for _c in range(0x80, 0x85):
    _WIDTH[_c] = 8
for _c in (0xA0, 0xA1, 0xA3, 0xC0, 0xC1, 0xE0):
    _WIDTH[_c] = _V8
for _c in (0xB0, 0xB1, 0xB3, 0xD0, 0xD1, 0xF0):
    _WIDTH[_c] = _V32


class _Malformed(Exception):
    """The bytes are not an encoded AMQP 1.0 message (see the module doc)."""


class Message(NamedTuple):
    """The parts of an AMQP 1.0 message a row shows (values as the module doc says)."""

    message_id: Any
    content_type: Any
    application_properties: dict[str, Any]
    body: bytes | None
    """The data sections joined; None when the message has none."""
    value: Any = None
    """The amqp-value section's value, or the amqp-sequence sections' lists (a list of
    them); None when the message has neither."""


def read(data: bytes) -> Message | None:
    """The parts of the encoded AMQP 1.0 message `data`, or None (see the module doc)."""
    try:
        return _read(data)
    except (_Malformed, IndexError, struct.error):
        return None


def _read(data: bytes) -> Message:
    n = len(data)
    i = 0
    message_id = content_type = value = None
    props: dict[str, Any] = {}
    body: list[bytes] | None = None
    sequence: list[Any] | None = None
    while i < n:
        if data[i] != 0 or data[i + 1] != 0x53:
            raise _Malformed
        code = data[i + 2]
        i += 3
        if code == _DATA:
            if data[i] != 0xA0 and data[i] != 0xB0:
                raise _Malformed  # a data section holds binary
            part, i = _value(data, i, n, 0)
            body = [part] if body is None else [*body, part]
        elif code == _PROPERTIES:
            message_id, content_type, i = _properties(data, i, n)
        elif code == _APP_PROPS:
            props, i = _value(data, i, n, 0)
            if not isinstance(props, dict):
                raise _Malformed
            props = {k if isinstance(k, str) else str(k): v for k, v in props.items()}
        elif code == _VALUE:
            value, i = _value(data, i, n, 0)
        elif code == _SEQUENCE:
            items, i = _value(data, i, n, 0)
            sequence = [items] if sequence is None else [*sequence, items]
        elif code in _STEPPED_OVER:
            i = _skip(data, i, n)
        else:
            raise _Malformed
    joined = None if body is None else b"".join(body)
    return Message(message_id, content_type, props, joined, value if sequence is None else sequence)


def _past(data: bytes, i: int, n: int, width: int) -> int:
    """The index after a value of `width` whose size (if any) starts at `i`."""
    if width >= 0:
        j = i + width
    elif width == _V8:
        j = i + 1 + data[i]
    else:
        j = i + 4 + _U32(data, i)[0]
    if j > n:
        raise _Malformed
    return j


def _skip(data: bytes, i: int, n: int) -> int:
    """The index after the value whose constructor is at `i` (described ones included)."""
    c = data[i]
    i += 1
    depth = 0
    while c == 0:  # a described value: a descriptor, then the value
        depth += 1
        if depth > _DEPTH:
            raise _Malformed
        i = _skip(data, i, n)
        c = data[i]
        i += 1
    width = _WIDTH[c]
    if width is None:
        raise _Malformed
    return _past(data, i, n, width)


def _value(data: bytes, i: int, n: int, depth: int) -> tuple[Any, int]:
    """The value whose constructor is at `i` (ending by `n`), and the index after it."""
    return _typed(data[i], data, i + 1, n, depth)


def _typed(c: int, data: bytes, i: int, n: int, depth: int) -> tuple[Any, int]:
    """The value of constructor `c` whose encoding starts at `i`, and the index after."""
    if c == 0xA1 or c == 0xA3 or c == 0xA0:
        j = i + 1 + data[i]
        if j > n:
            raise _Malformed
        raw = data[i + 1 : j]
        return (raw if c == 0xA0 else raw.decode("utf-8", "replace")), j
    if c == 0x40:
        return None, i
    if c == 0xB1 or c == 0xB3 or c == 0xB0:
        j = i + 4 + _U32(data, i)[0]
        if j > n:
            raise _Malformed
        raw = data[i + 4 : j]
        return (raw if c == 0xB0 else raw.decode("utf-8", "replace")), j
    if c == 0x41 or c == 0x42:
        return c == 0x41, i
    if c == 0x43 or c == 0x44:
        return 0, i
    if c == 0x45:
        return [], i
    if c == 0:
        if depth >= _DEPTH:
            raise _Malformed
        _descriptor, i = _value(data, i, n, depth + 1)
        return _value(data, i, n, depth + 1)
    width = _WIDTH[c]
    if width is None:
        raise _Malformed
    if width < 0:
        return _compound(c, data, i, n, depth)
    j = i + width
    if j > n:
        raise _Malformed
    if c == 0x50 or c == 0x52 or c == 0x53:
        return data[i], j
    if c == 0x51 or c == 0x54 or c == 0x55:
        return _I8(data, i)[0], j
    if c == 0x56:
        return data[i] == 1, j
    if c == 0x60:
        return _U16(data, i)[0], j
    if c == 0x61:
        return _I16(data, i)[0], j
    if c == 0x70:
        return _U32(data, i)[0], j
    if c == 0x71:
        return _I32(data, i)[0], j
    if c == 0x72:
        return _F32(data, i)[0], j
    if c == 0x73:  # a char: a code point that is no character (a surrogate) is U+FFFD
        cp = _U32(data, i)[0]
        return (chr(cp) if cp < 0xD800 or 0xE000 <= cp <= 0x10FFFF else "\ufffd"), j
    if c == 0x80:
        return _U64(data, i)[0], j
    if c == 0x81 or c == 0x83:  # long, timestamp (milliseconds)
        return _I64(data, i)[0], j
    if c == 0x82:
        return _F64(data, i)[0], j
    if c == 0x98:
        return uuid.UUID(bytes=bytes(data[i:j])), j
    return bytes(data[i:j]), j  # the decimals: their encoded bytes


def _compound(c: int, data: bytes, i: int, n: int, depth: int) -> tuple[Any, int]:
    """A list, map or array (constructor `c`) whose size starts at `i`; the index after."""
    if depth >= _DEPTH:
        raise _Malformed
    if c in (0xC0, 0xC1, 0xE0):
        size, end = data[i], i + 1 + data[i]
        count, j = data[i + 1], i + 2
    else:
        size = _U32(data, i)[0]
        end = i + 4 + size
        count, j = _U32(data, i + 4)[0], i + 8
    if end > n or j > end or count > size:
        raise _Malformed
    items: list[Any] = []
    if c == 0xE0 or c == 0xF0:  # an array: one constructor, then the bare values
        if count:
            ec = data[j]
            j += 1
            if ec == 0:
                _descriptor, j = _value(data, j, end, depth + 1)
                ec = data[j]
                j += 1
            for _ in range(count):
                item, j = _typed(ec, data, j, end, depth + 1)
                items.append(item)
    else:
        for _ in range(count):
            item, j = _value(data, j, end, depth + 1)
            items.append(item)
    if j != end:
        raise _Malformed
    if c == 0xC1 or c == 0xD1:
        if count % 2:
            raise _Malformed
        return {_key(items[k]): items[k + 1] for k in range(0, count, 2)}, end
    return items, end


def _key(value: Any) -> Any:
    """A map key as a dict key (a list or a map as its text)."""
    return str(value) if isinstance(value, (list, dict)) else value


def _properties(data: bytes, i: int, n: int) -> tuple[Any, Any, int]:
    """(message-id, content-type, index after) of the properties list at `i`."""
    c = data[i]
    if c == 0x45:  # list0: no properties
        return None, None, i + 1
    if c == 0xC0:
        size, end = data[i + 1], i + 2 + data[i + 1]
        count, j = data[i + 2], i + 3
    elif c == 0xD0:
        size = _U32(data, i + 1)[0]
        end = i + 5 + size
        count, j = _U32(data, i + 5)[0], i + 9
    else:
        raise _Malformed
    if end > n or j > end or count > size:
        raise _Malformed
    message_id = content_type = None
    for k in range(min(count, 7)):
        if k == 0:
            message_id, j = _value(data, j, end, 1)
        elif k == 6:
            content_type, j = _value(data, j, end, 1)
        elif data[j] == 0x40:  # null, the usual value of the fields between
            j += 1
        else:
            j = _skip(data, j, end)
    if count <= 7 and j != end:
        raise _Malformed
    return message_id, content_type, end
