"""aiormq / pamqp: a delivery whose properties pamqp cannot decode still reaches ackkit.

aiormq decodes each frame with pamqp in its frame receiver; a content header
or a basic.deliver pamqp cannot read (a shortstr or header name that is not
UTF-8, a timestamp past year 9999, a field table nested deeper than the
recursion limit) fails the whole connection, and the broker hands the same
message first again after the reconnect.

ackkit's connections read the socket through `FrameFilter` (installed per
connection with aiormq's `transport_factory` hook, by `SafeConnection`): it
passes frames through unchanged, except one pamqp would fail on. Such a content
header is replaced by one carrying only the properties that could be salvaged
(`ackkit._connection.salvage`); such a basic.deliver / basic.get-ok by one whose names have
the undecodable bytes replaced. The reason is kept, per connection, under the
delivery's channel and tag, where the consumer finds it (`unreadable()`) and
passes it to `ListenerCore.receive`, which dead-letters the delivery.

Cost: each content header and delivery method frame is checked here before
pamqp decodes it in aiormq's receiver. A raw scan passes the usual ones
(ASCII names, a headers table of plain values; `_plain_header`,
`_ascii_delivery_tag`); only the others are decoded a second time, by pamqp
here, and only one pamqp cannot read takes the salvage path.
"""

from __future__ import annotations

import asyncio
import struct
import weakref
from collections.abc import Mapping
from typing import Any

import pamqp.decode
import pamqp.frame
from aiormq.abc import AbstractConnection
from pamqp import commands as spec
from pamqp.header import ContentHeader

from .._connection.salvage import (
    FRAME_HEADER,
    FRAME_METHOD,
    describe,
    read_delivery_method,
    salvage_header,
)
from .._telemetry.logs import log_blocked

_MAX_KEPT = 10_000  # reasons of deliveries nobody asked about (their channel closed first)


class Reasons:
    """Per connection: why a delivery could not be read, by (channel number, delivery tag)."""

    def __init__(self) -> None:
        self._by_tag: dict[tuple[int, int], str] = {}
        self._last_tag: dict[int, int] = {}

    def add(self, channel: int, tag: int, why: str) -> None:
        if len(self._by_tag) >= _MAX_KEPT:
            self._by_tag.pop(next(iter(self._by_tag)))
        old = self._by_tag.get((channel, tag))
        self._by_tag[(channel, tag)] = f"{old}; {why}" if old else why

    def pop(self, channel: int, tag: int) -> str | None:
        if not self._by_tag:  # the usual case: every delivery could be read
            return None
        return self._by_tag.pop((channel, tag), None)


_REASONS: weakref.WeakKeyDictionary[Any, Reasons] = weakref.WeakKeyDictionary()


def reasons_of(connection: AbstractConnection | None) -> Reasons | None:
    """The unreadable deliveries of `connection` (None: not read through a FrameFilter)."""
    return _REASONS.get(connection) if connection is not None else None


def unreadable(connection: AbstractConnection | None, channel: int, tag: int) -> str | None:
    """Why the delivery `tag` of channel number `channel` could not be read, or None."""
    reasons = _REASONS.get(connection) if connection is not None else None
    return reasons.pop(channel, tag) if reasons is not None else None


def _decode_table(raw: bytes) -> Mapping[str, Any]:
    _, table = pamqp.decode.field_table(raw)
    return table


_PAMQP_NAMES = {"type": "message_type"}


def _props(fields: Mapping[str, Any]) -> spec.Basic.Properties:
    kw = {_PAMQP_NAMES.get(k, k): v for k, v in fields.items() if k != "cluster_id"}
    ts = kw.get("timestamp")
    if ts is not None:
        # pamqp reads a timestamp past 2106 as milliseconds; hand it over as a datetime
        kw["timestamp"] = pamqp.decode.timestamp(struct.pack(">Q", ts))[1]
    return spec.Basic.Properties(**kw)


class FrameFilter:
    """The asyncio.StreamReader aiormq reads from, rewriting frames pamqp cannot decode.

    Implements what aiormq's frame receiver calls: readexactly(), read(), at_eof().
    Method and content header frames on a channel are read whole and checked (most
    pass by a cheap test, see `_check`); the payload of every other frame (bodies,
    heartbeats, connection methods) is read straight from the socket's reader.
    """

    def __init__(self, reader: asyncio.StreamReader, reasons: Reasons, name: str = "") -> None:
        self._name = name  # the connection's name, for the blocked / unblocked lines
        self._reader = reader
        self._reasons = reasons
        self._buf = b""  # the checked frame being handed out, from _pos on
        self._pos = 0
        self._through = 0  # bytes of the current frame still to read from the reader
        self._started = False

    def at_eof(self) -> bool:
        return self._pos >= len(self._buf) and self._reader.at_eof()

    async def read(self, n: int = -1) -> bytes:
        buf, pos = self._buf, self._pos
        if pos < len(buf):
            out = buf[pos:] if n < 0 else buf[pos : pos + n]
            self._pos = pos + len(out)
            return out
        out = await self._reader.read(n)
        self._through = max(0, self._through - len(out))
        return out

    async def readexactly(self, n: int) -> bytes:
        if self._pos >= len(self._buf) and not self._through:  # at a frame boundary
            try:
                await self._next_frame()
            except asyncio.IncompleteReadError as exc:
                raise asyncio.IncompleteReadError(exc.partial, n) from None
        buf, pos = self._buf, self._pos
        end = pos + n
        if end <= len(buf):
            self._pos = end
            return buf if pos == 0 and end == len(buf) else buf[pos:end]
        if pos >= len(buf) and n <= self._through:
            self._through -= n
            return await self._reader.readexactly(n)
        return await self._gather(n)

    async def _gather(self, n: int) -> bytes:
        """readexactly(n) across frame boundaries (not aiormq's way of reading)."""
        out = bytearray(self._buf[self._pos :])
        self._buf, self._pos = b"", 0
        try:
            while len(out) < n:
                need = n - len(out)
                if self._through:
                    k = min(need, self._through)
                    out += await self._reader.readexactly(k)
                    self._through -= k
                else:
                    await self._next_frame()
                    k = min(need, len(self._buf))
                    out += self._buf[:k]
                    self._pos = k
        except asyncio.IncompleteReadError as exc:
            raise asyncio.IncompleteReadError(bytes(out) + exc.partial, n) from None
        return bytes(out)

    async def _next_frame(self) -> None:
        head = await self._reader.readexactly(7)
        self._buf, self._pos = head, 0
        if not self._started and head.startswith(b"AMQP"):  # the broker's protocol header
            return
        self._started = True
        ftype, channel, size = _FRAME_HEAD.unpack(head)
        if not channel and ftype == FRAME_METHOD:  # connection methods: rare, read whole
            rest = await self._reader.readexactly(size + 1)
            self._buf = head + rest
            if rest[:4] in (_BLOCKED, _UNBLOCKED):
                reason = rest[5 : 5 + rest[4]] if rest[:4] == _BLOCKED and size > 4 else None
                log_blocked(self._name, None if reason is None else reason.decode(errors="replace"))
            return
        if not (channel and ftype in (FRAME_METHOD, FRAME_HEADER)):
            self._through = size + 1
            return
        rest = await self._reader.readexactly(size + 1)
        fixed = self._check(ftype, channel, rest[:-1])
        if fixed is not None:
            self._buf = pamqp.frame.marshal(fixed, channel)
        else:
            self._buf = head + rest

    def _check(self, ftype: int, channel: int, payload: bytes) -> Any:
        """A replacement for a frame pamqp cannot decode, else None."""
        if ftype == FRAME_METHOD:
            if payload.startswith(_BASIC_DELIVER):
                tag = _ascii_delivery_tag(payload)
                if tag is not None:  # every name decodes: nothing to rewrite
                    self._reasons._last_tag[channel] = tag
                    return None
            m = read_delivery_method(payload)
            if m is None:
                return None
            self._reasons._last_tag[channel] = m.delivery_tag
            if not m.problems:
                return None
            self._reasons.add(channel, m.delivery_tag, "; ".join(m.problems))
            if payload[2:4] == b"\x00\x3c":  # basic.deliver
                return spec.Basic.Deliver(
                    m.consumer_tag, m.delivery_tag, m.redelivered, m.exchange, m.routing_key
                )
            return spec.Basic.GetOk(
                m.delivery_tag, m.redelivered, m.exchange, m.routing_key, m.message_count
            )
        if _plain_header(payload):
            return None
        try:
            ContentHeader().unmarshal(payload)
            return None
        except Exception as exc:  # ValueError, RecursionError, OverflowError, struct.error
            error = exc
        try:
            s = salvage_header(payload, _decode_table)
        except ValueError:
            return None  # not even the body size: let aiormq fail as before
        why = s.reason or describe(error)
        tag = self._reasons._last_tag.get(channel)
        if tag is not None:
            self._reasons.add(channel, tag, why)
        try:
            props = _props(s.fields)
        except Exception:
            props = spec.Basic.Properties()
        return ContentHeader(0, s.body_size, props)


_FRAME_HEAD = struct.Struct(">BHI")
_TAG = struct.Struct(">Q")
_BASIC_DELIVER = b"\x00\x3c\x00\x3c"
_BLOCKED = b"\x00\x0a\x00\x3c"  # connection.blocked
_UNBLOCKED = b"\x00\x0a\x00\x3d"  # connection.unblocked


def _ascii_delivery_tag(payload: bytes) -> int | None:
    """The delivery tag of a basic.deliver payload whose exchange and routing key are
    ASCII (so `read_delivery_method` finds no problem); None: ask it."""
    try:
        pos = 5 + payload[4]  # after the consumer tag
        (tag,) = _TAG.unpack_from(payload, pos)
        pos += 9  # the tag and the redelivered bit
        payload[pos + 1 + payload[pos]]  # the routing key's length is there to read
    except (struct.error, IndexError):
        return None
    return int(tag) if payload[pos:].isascii() else None


# Content header properties in the order pamqp reads them, by flag bit, and their kind:
# everything but timestamp and continued flags.
_OCTET, _SHORTSTR, _TABLE = 0, 1, 2
_PLAIN_PROPERTIES = tuple(
    (1 << bit, _TABLE if bit == 13 else _OCTET if bit in (12, 11) else _SHORTSTR)
    for bit in (15, 14, 13, 12, 11, 10, 9, 8, 7, 5, 4, 3, 2)
)
_NOT_PLAIN = 1 << 6 | 1  # timestamp, more flags follow
_plain_layouts: dict[int, tuple[int, ...]] = {}


def _plain_header(payload: bytes) -> bool:
    """True when pamqp surely reads this content header: no timestamp property, every
    property there to read (pamqp fails on a missing one), every shortstr ASCII and the
    headers table plain (`_plain_table`). False means: ask pamqp."""
    size = len(payload)
    if size < 14:
        return False
    flags = payload[12] << 8 | payload[13]
    layout = _plain_layouts.get(flags)
    if layout is None:
        if flags & _NOT_PLAIN:
            return False
        layout = _plain_layouts[flags] = tuple(k for bit, k in _PLAIN_PROPERTIES if flags & bit)
    pos = 14
    for kind in layout:
        if pos >= size:
            return False
        if kind == _SHORTSTR:
            end = pos + 1 + payload[pos]
            if not payload[pos + 1 : end].isascii():
                return False
            pos = end
        elif kind == _OCTET:
            pos += 1
        else:
            pos = _plain_table(payload, pos, 0)
            if pos < 0:
                return False
    return True


# Field values pamqp reads from any bytes of their fixed size (AMQP 0-9-1 errata types).
_FIXED = {
    ord(k): n for k, n in zip("tbBsuIilLfdV", (1, 1, 1, 2, 2, 4, 4, 8, 8, 4, 8, 0), strict=True)
}
_FIXED[0] = 0  # void, as pamqp reads it
_SIZED = frozenset(b"Sx")  # long string, byte array: a 4-byte length, then that many bytes
_LATEST_T = 253_402_300_799  # 9999-12-31T23:59:59Z: datetime holds no later second
_MAX_DEPTH = 8  # deeper tables and arrays: pamqp decides (its recursion limit)
_U32 = struct.Struct(">I")


def _plain_table(payload: bytes, pos: int, depth: int) -> int:
    """Where the field table at `pos` ends when pamqp surely reads it, else -1.

    Plain: it lies whole in the payload, every name is ASCII, every value is of a
    type pamqp reads from any bytes (or a string, byte array, table or array of such
    values, not too deep) and ends inside the table, and every timestamp fits a
    datetime. Anything else (decimals, truncation, a value running past the table's
    end, which pamqp may still read) is left to pamqp: -1."""
    if pos + 4 > len(payload) or depth > _MAX_DEPTH:
        return -1
    end = pos + 4 + _U32.unpack_from(payload, pos)[0]
    if end > len(payload):
        return -1
    pos += 4
    while pos < end:
        name = pos + 1 + payload[pos]
        if name >= end or not payload[pos + 1 : name].isascii():
            return -1
        pos = _plain_value(payload, name, end, depth)
        if pos < 0:
            return -1
    return pos if pos == end else -1


def _plain_value(payload: bytes, pos: int, end: int, depth: int) -> int:
    """Where the typed field value at `pos` ends (inside `end`) when plain, else -1."""
    kind = payload[pos]
    pos += 1
    n = _FIXED.get(kind)
    if n is not None:
        pos += n
    elif kind in _SIZED:
        if pos + 4 > end:
            return -1
        pos += 4 + _U32.unpack_from(payload, pos)[0]
    elif kind == 0x54:  # T: a timestamp, milliseconds past 2106 as pamqp reads it
        if pos + 8 > end:
            return -1
        (ts,) = _TAG.unpack_from(payload, pos)
        if ts > 0xFFFFFFFF and ts > _LATEST_T * 1000:
            return -1
        pos += 8
    elif kind == 0x46:  # F: a table
        pos = _plain_table(payload, pos, depth + 1)
        if pos < 0:
            return -1
    elif kind == 0x41:  # A: an array of typed values
        if pos + 4 > end or depth >= _MAX_DEPTH:
            return -1
        last = pos + 4 + _U32.unpack_from(payload, pos)[0]
        if last > end:
            return -1
        pos += 4
        while pos < last:
            pos = _plain_value(payload, pos, last, depth + 1)
            if pos < 0:
                return -1
        if pos != last:
            return -1
    else:
        return -1
    return pos if pos <= end else -1


def minimal_properties() -> spec.Basic.Properties:
    return spec.Basic.Properties()
