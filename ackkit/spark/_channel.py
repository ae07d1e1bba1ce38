"""The Spark source consumer's channel: opened, consuming, refused, cancelled, lost.

`SourceChannel` is the part of `SourceConsumer` (spark/_consumer.py) that runs the
life of its one consuming channel on the I/O thread: basic.qos then basic.consume
on a fresh channel, the broker's answer, a close (what `_deploy.channel_verdict`
makes of it: try again after a pause, wait for an exclusive consumer to go, or fail
the query) and a broker's basic.cancel. The deliveries themselves are the
consumer's (`_on_message`).
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from typing import TYPE_CHECKING, Any

from .._connection.url import mask_text
from .._core.listener import ListenerCore
from .._telemetry.logs import log_cancel
from ._deploy import channel_verdict
from ._options import SourceOptions
from ._rows import Item

if TYPE_CHECKING:
    from ._core.batches import BatchLedger

log = logging.getLogger("ackkit.spark")


class SourceChannel:
    """The consuming channel's life (a mixin of `SourceConsumer`; its state declared here)."""

    opts: SourceOptions
    core: ListenerCore
    ledger: BatchLedger
    lock: threading.Lock
    channel: Any
    buffer: collections.deque[Item]
    _consumer_tag: str | None
    _ready: threading.Event
    _refused_since: float | None
    waiting_for: str | None
    """Set to "exclusive" while another consumer holds the queue (the source waits)."""

    connection: Any  # the engine's
    stopping: bool

    if TYPE_CHECKING:

        def fail_query(self, why: str) -> None: ...
        def _on_message(self, ch: Any, method: Any, props: Any, body: bytes) -> None: ...

    def _on_channel_open(self, ch: Any) -> None:
        self.channel = ch
        ch.add_on_close_callback(self._on_channel_closed)
        ch.add_on_cancel_callback(lambda _frame: self._on_cancelled(ch))
        with self.lock:
            self.core.channel_opened()
        ch.basic_qos(prefetch_count=self.opts.prefetch, callback=lambda _f: self._consume(ch))

    def _consume(self, ch: Any) -> None:
        self._consumer_tag = ch.basic_consume(
            self.opts.queue,
            self._on_message,
            exclusive=self.opts.exclusive,
            callback=self._on_consuming,
        )

    def _on_consuming(self, _frame: Any) -> None:
        if self._refused_since is not None:
            log.warning("ackkit.spark: %r: consuming now", self.opts.queue)
        self._refused_since = self.waiting_for = None
        self._ready.set()

    def _on_channel_closed(self, ch: Any, reason: BaseException) -> None:
        if ch is not self.channel:
            return
        self.channel = None
        with self.lock:
            dropped = self.ledger.channel_closed() + len(self.buffer)
            self.buffer.clear()
        if dropped:
            log.info("ackkit.spark: channel closed, %d unacked deliveries requeued", dropped)
        code, now = getattr(reason, "reply_code", 0), time.monotonic()
        text = mask_text(str(getattr(reason, "reply_text", reason)))
        since = self._refused_since = (self._refused_since or now) if code == 403 else None
        v = channel_verdict(
            self.opts.queue,
            code,
            text,
            exclusive=self.opts.exclusive,
            refused_for=0.0 if since is None else now - since,
            patience=self.opts.exclusive_wait,
        )
        self.waiting_for = "exclusive" if since is not None and v.retry else None
        if v.fail is not None:  # the query fails on the reader's next call
            log.error("ackkit.spark: %s", v.fail)
            self.fail_query(v.fail)
            return
        if v.log is not None:
            log.warning("ackkit.spark: %s", v.log)
        elif code not in (0, 200, 320, 403):
            log.error("ackkit.spark: channel closed by the broker: %s", text)
        conn = self.connection
        if not self.stopping and conn is not None and conn.is_open:
            conn.ioloop.call_later(1.0, lambda: self._reopen(conn))

    def _on_cancelled(self, ch: Any) -> None:
        """basic.cancel from the broker (RabbitMQ 4.3's consumer timeout): fenced like a
        lost channel, then this channel is closed and a new one consumes. A cancel that
        comes while the channel is already closing was fenced by the first: closing it
        again would raise in pika's callback and lose the whole connection."""
        if ch is self.channel and not self.stopping and ch.is_open:
            with self.lock:
                log_cancel(log, f"ackkit.spark:{self.opts.queue}", self.core.consumer_cancelled())
            ch.close()

    def _reopen(self, conn: Any) -> None:
        if conn.is_open and not self.stopping and self.channel is None:
            conn.channel(on_open_callback=self._on_channel_open)
