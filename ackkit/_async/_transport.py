"""The aiormq connection of every ackkit asyncio connection: read through a
`FrameFilter` (`ackkit._async._frames`: undecodable deliveries are salvaged, the broker's
connection.blocked is logged) and written through a `CloseGuard`
(`ackkit._async._closing`: no frame after a channel's close)."""

from __future__ import annotations

import asyncio
from typing import Any

import aio_pika
import aio_pika.abc
from aiormq.connection import TCPTransportFactory, TLSTransportFactory, TransportFactory
from yarl import URL

from ._closing import CloseGuard
from ._frames import _REASONS, FrameFilter, Reasons


class SafeTransportFactory(TransportFactory):
    """aiormq's own transport (TCP or TLS), read through a FrameFilter and written
    through a CloseGuard (`ackkit._async._closing`)."""

    def __init__(self, url: URL, reasons: Reasons, name: str = "") -> None:
        self._inner = TLSTransportFactory() if url.scheme == "amqps" else TCPTransportFactory()
        self._reasons = reasons
        self._name = name

    async def create(
        self, url: URL, **kwargs: Any
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        reader, writer = await self._inner.create(url, **kwargs)
        return FrameFilter(reader, self._reasons, self._name), CloseGuard(writer)  # type: ignore[return-value]


class SafeConnection(aio_pika.Connection):
    """An aio-pika connection whose aiormq connection reads through a FrameFilter."""

    async def connect(self, timeout: Any = None) -> None:
        reasons = Reasons()
        self.transport = await aio_pika.abc.UnderlayConnection.connect(
            self.url,
            self._on_connection_close,
            timeout=timeout,
            transport_factory=SafeTransportFactory(
                self.url,
                reasons,
                str((self.kwargs.get("client_properties") or {}).get("connection_name", "")),
            ),
            **self.kwargs,
        )
        _REASONS[self.transport.connection] = reasons
        await self._on_connected()
