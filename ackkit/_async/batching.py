"""Batch collection for an AsyncConsumer whose listener takes its deliveries in batches.

A batch is handed over as soon as it holds `size` deliveries; a partial batch
is due `timeout` seconds after its first delivery arrived (a loop timer). The
batch only groups deliveries for one handler call: each delivery is still
started, settled and released through the listener's core one by one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from .._messages.delivery import DeliveryBase


class Batcher:
    """The batch being filled, and the timer that hands it over when it stays partial."""

    def __init__(
        self,
        size: int,
        timeout: float,
        loop: asyncio.AbstractEventLoop,
        due: Callable[[list[DeliveryBase]], None],
    ) -> None:
        self.size = size
        self.timeout = timeout
        self.loop = loop
        self.due = due  # gets a partial batch whose time is up
        self.buf: list[DeliveryBase] = []
        self.timer: asyncio.TimerHandle | None = None

    def add(self, d: DeliveryBase) -> list[DeliveryBase] | None:
        """Add `d`; the batch when it is now full, else None."""
        buf = self.buf
        buf.append(d)
        if len(buf) >= self.size:
            return self.take()
        if len(buf) == 1:
            self.timer = self.loop.call_later(self.timeout, self._expired)
        return None

    def take(self) -> list[DeliveryBase]:
        """The batch as it is (possibly empty), its timer off; a new one starts empty."""
        buf, self.buf = self.buf, []
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        return buf

    def _expired(self) -> None:
        self.timer = None
        buf, self.buf = self.buf, []
        if buf:
            self.due(buf)
