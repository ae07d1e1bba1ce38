"""aiormq: no frame goes out on a channel number after that channel's close.

When the broker closes a channel (a 403 on a publish, a 404), aiormq answers with
channel.close-ok at once but marks the channel closed only a few loop turns later.
A publish that was waiting for the channel's lock in that gap still gets its frames
queued, behind the close-ok. The broker has forgotten the number by then, and a
basic.publish on a number it does not have open closes the whole connection:
504 "CHANNEL_ERROR - expected 'channel.open'", so every other channel on it goes too.

`CloseGuard` is the asyncio.StreamWriter aiormq writes through (installed with the
connection's transport factory, `ackkit._async._transport.SafeTransportFactory`). Once a
channel.close or channel.close-ok went out on a number, it drops every later frame on that
number except a channel.close-ok (the answer to a close that crossed ours) and the
channel.open of a new channel. Nothing is lost by it: such a frame could only close
the connection, and a publish it drops is answered by its closed channel (aiormq
rejects the channel's pending confirms with the close's reason).
"""

from __future__ import annotations

import asyncio
import logging
import struct
from typing import Any

from .._connection.salvage import FRAME_METHOD

log = logging.getLogger("ackkit")

_HEAD = struct.Struct(">BHIHH")  # frame type, channel, size, class id, method id
_CHANNEL_OPEN = (20, 10)
_CHANNEL_CLOSE = (20, 40)
_CHANNEL_CLOSE_OK = (20, 41)


class CloseGuard:
    """An asyncio.StreamWriter that drops frames on channels that are closing or closed.

    aiormq writes one channel's frames per write() (a method with its content header
    and body frames), so the first frame of a write names the channel and the method.
    """

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self._writer = writer
        self._closed: set[int] = set()  # numbers a close or close-ok went out on

    def write(self, data: bytes) -> None:
        if len(data) >= _HEAD.size and data[0] == FRAME_METHOD:
            _, channel, _, cls, method = _HEAD.unpack_from(data)
            if channel:
                if self._passes(channel, (cls, method)):
                    self._writer.write(data)
                return
        self._writer.write(data)

    def _passes(self, channel: int, method: tuple[int, int]) -> bool:
        if method == _CHANNEL_OPEN:
            self._closed.discard(channel)
            return True
        if channel in self._closed:
            if method == _CHANNEL_CLOSE_OK:
                return True
            log.debug("dropped a frame (method %s) on closed channel %d", method, channel)
            return False
        if method in (_CHANNEL_CLOSE, _CHANNEL_CLOSE_OK):
            self._closed.add(channel)
        return True

    def __getattr__(self, name: str) -> Any:  # drain, close, transport, is_closing, ...
        return getattr(self._writer, name)
