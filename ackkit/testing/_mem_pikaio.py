"""What pika's stand-ins share: properties to and from their wire bytes, channel-close
reasons as pika's exceptions, what both kinds of connection and channel do alike, and the
I/O loop a SelectConnection runs."""

from __future__ import annotations

import heapq
import itertools
import struct
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any, cast

import pika.exceptions
import pika.frame
import pika.spec

from .._core import wire
from .._sync import _frames as frames
from ._mem_channel import ModelChannel
from ._mem_model import Model
from ._mem_state import Message, Sink

Callback = Callable[..., Any]


def encode_props(props: Any) -> bytes:
    """The wire bytes of a publisher's properties (pika's or ackkit's WireProperties)."""
    if props is None:
        return wire.encode_properties({})
    return b"".join(props.encode())


def decode_props(msg: Message) -> Any:
    """pika BasicProperties for `msg`, as `SafeSelectConnection` would hand them over."""
    payload = struct.pack(">HHQ", 60, 0, len(msg.body)) + msg.props
    try:
        props = pika.spec.BasicProperties()
        props.decode(msg.props)
    except Exception as exc:  # what the runtime's frame filter salvages
        return frames.salvaged_properties(payload, exc)[1]
    if frames._suspect(props):
        return frames.salvaged_properties(payload, None)[1]
    if props.headers:
        props.wire_headers = wire.decode_properties(msg.props).get("headers")
    return props


def closed_error(code: int, text: str) -> pika.exceptions.ChannelClosed:
    if code in (0, 200):
        return pika.exceptions.ChannelClosedByClient(code, text)
    return pika.exceptions.ChannelClosedByBroker(code, text)


class PikaConnection:
    """What a pika `SelectConnection` and a `BlockingConnection` stand-in share: their
    broker, the connection name pika's parameters give, the numbers of their channels."""

    def __init__(self, broker: Any, parameters: Any) -> None:
        self.broker = broker
        self.model: Model = broker.model
        self.params = parameters
        self.name = str(getattr(parameters, "client_properties", {}).get("connection_name", ""))
        self._numbers = itertools.count(1)

    def next_channel(self) -> int:
        return next(self._numbers)


class PikaChannel(ModelChannel):
    """What a pika `Channel` and a `BlockingChannel` answer alike: opening on their
    connection, whether they are closed, and the acks."""

    def __init__(self, conn: PikaConnection) -> None:
        self._model = conn.model
        sink = cast(Sink, self)  # a subclass answers deliver, closed and cancelled
        self.state = conn.model.open_channel(sink, conn.name)
        self.channel_number = conn.next_channel()

    @property
    def is_closed(self) -> bool:
        return not self.state.open

    def basic_ack(self, delivery_tag: int = 0, multiple: bool = False) -> None:
        self._settle("ack", delivery_tag, multiple, False)

    def basic_nack(
        self, delivery_tag: int = 0, multiple: bool = False, requeue: bool = True
    ) -> None:
        self._settle("nack", delivery_tag, multiple, requeue)

    def basic_reject(self, delivery_tag: int = 0, requeue: bool = True) -> None:
        self._settle("reject", delivery_tag, False, requeue)


class IOLoop:
    """The callbacks and timers of one connection, run by `start()` on its I/O thread."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._ready: deque[Callback] = deque()
        self._timers: list[tuple[float, int, Callback]] = []
        self._ids = itertools.count()
        self._cancelled: set[int] = set()
        self._running = False
        self._stop = False
        self.closed = False

    def add_callback_threadsafe(self, fn: Callback) -> None:
        if self.closed:
            raise RuntimeError("the I/O loop is closed")
        with self._cond:
            self._ready.append(fn)
            self._cond.notify()

    add_callback = add_callback_threadsafe

    def call_later(self, delay: float, fn: Callback) -> int:
        with self._cond:
            n = next(self._ids)
            heapq.heappush(self._timers, (time.monotonic() + delay, n, fn))
            self._cond.notify()
            return n

    def remove_timeout(self, handle: int) -> None:
        with self._cond:
            self._cancelled.add(handle)

    def stop(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify()

    def close(self) -> None:
        self.closed = True

    def start(self) -> None:
        self._stop = False
        while True:
            with self._cond:
                while not self._stop and not self._ready and not self._due():
                    wait = self._timers[0][0] - time.monotonic() if self._timers else None
                    self._cond.wait(wait)
                if self._stop and not self._ready:
                    return
                batch = list(self._ready)
                self._ready.clear()
                now = time.monotonic()
                while self._timers and self._timers[0][0] <= now:
                    _, n, fn = heapq.heappop(self._timers)
                    if n in self._cancelled:
                        self._cancelled.discard(n)
                    else:
                        batch.append(fn)
            for fn in batch:
                fn()

    def _due(self) -> bool:
        return bool(self._timers) and self._timers[0][0] <= time.monotonic()
