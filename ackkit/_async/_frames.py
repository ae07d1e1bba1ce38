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
(`ackkit._wire`); such a basic.deliver / basic.get-ok by one whose names have
the undecodable bytes replaced. The reason is kept, per connection, under the
delivery's channel and tag, where the consumer finds it (`unreadable()`) and
passes it to `ListenerCore.receive`, which dead-letters the delivery.

Cost: each content header and delivery method frame is decoded once more
here (pamqp decodes it again in aiormq's receiver).
"""

from __future__ import annotations

import asyncio
import struct
import weakref
from collections.abc import Mapping
from typing import Any

import aio_pika
import aio_pika.abc
import pamqp.decode
import pamqp.frame
from aiormq.abc import AbstractConnection
from aiormq.connection import TCPTransportFactory, TLSTransportFactory, TransportFactory
from pamqp import commands as spec
from pamqp.header import ContentHeader
from yarl import URL

from .._wire import FRAME_HEADER, FRAME_METHOD, describe, read_delivery_method, salvage_header

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
        return self._by_tag.pop((channel, tag), None)


_REASONS: weakref.WeakKeyDictionary[Any, Reasons] = weakref.WeakKeyDictionary()


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
    """

    def __init__(self, reader: asyncio.StreamReader, reasons: Reasons) -> None:
        self._reader = reader
        self._reasons = reasons
        self._buf = bytearray()
        self._started = False

    def at_eof(self) -> bool:
        return not self._buf and self._reader.at_eof()

    async def read(self, n: int = -1) -> bytes:
        if self._buf:
            out = bytes(self._buf if n < 0 else self._buf[:n])
            del self._buf[: len(out)]
            return out
        return await self._reader.read(n)

    async def readexactly(self, n: int) -> bytes:
        while len(self._buf) < n:
            try:
                await self._next_frame()
            except asyncio.IncompleteReadError as exc:
                partial = bytes(self._buf) + exc.partial
                self._buf.clear()
                raise asyncio.IncompleteReadError(partial, n) from None
        out = bytes(self._buf[:n])
        del self._buf[:n]
        return out

    async def _next_frame(self) -> None:
        head = await self._reader.readexactly(7)
        if not self._started and head.startswith(b"AMQP"):  # the broker's protocol header
            self._buf += head
            return
        self._started = True
        ftype, channel, size = struct.unpack(">BHI", head)
        rest = await self._reader.readexactly(size + 1)
        if channel and ftype in (FRAME_METHOD, FRAME_HEADER):
            fixed = self._check(ftype, channel, rest[:-1])
            if fixed is not None:
                self._buf += pamqp.frame.marshal(fixed, channel)
                return
        self._buf += head
        self._buf += rest

    def _check(self, ftype: int, channel: int, payload: bytes) -> Any:
        """A replacement for a frame pamqp cannot decode, else None."""
        if ftype == FRAME_METHOD:
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


class SafeTransportFactory(TransportFactory):
    """aiormq's own transport (TCP or TLS), read through a FrameFilter."""

    def __init__(self, url: URL, reasons: Reasons) -> None:
        self._inner = TLSTransportFactory() if url.scheme == "amqps" else TCPTransportFactory()
        self._reasons = reasons

    async def create(
        self, url: URL, **kwargs: Any
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        reader, writer = await self._inner.create(url, **kwargs)
        return FrameFilter(reader, self._reasons), writer  # type: ignore[return-value]


class SafeConnection(aio_pika.Connection):
    """An aio-pika connection whose aiormq connection reads through a FrameFilter."""

    async def connect(self, timeout: Any = None) -> None:
        reasons = Reasons()
        self.transport = await aio_pika.abc.UnderlayConnection.connect(
            self.url,
            self._on_connection_close,
            timeout=timeout,
            transport_factory=SafeTransportFactory(self.url, reasons),
            **self.kwargs,
        )
        _REASONS[self.transport.connection] = reasons
        await self._on_connected()


def minimal_properties() -> spec.Basic.Properties:
    return spec.Basic.Properties()
