"""pika's face of the in-memory broker: a SelectConnection and a BlockingConnection.

The App's runtime (and pull mode, the DLQ tool, the test kit) use these exactly
as they use pika's own: channels with callbacks on an I/O loop that runs on the
caller's I/O thread, pika's exceptions, pika's `BasicProperties` decoded from
the bytes a publisher's properties encode to (so every header goes through the
same codecs as on the wire, and a copy keeps its raw headers like
`SafeSelectConnection` does).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pika.exceptions
import pika.frame
import pika.spec

from ._mem_pikaio import (
    Callback,
    IOLoop,
    PikaChannel,
    PikaConnection,
    closed_error,
    decode_props,
    encode_props,
)
from ._mem_state import ChannelError, Message


class SelectChannel(PikaChannel):
    """A pika `Channel` on the in-memory broker (callback style, I/O thread only)."""

    def __init__(self, conn: SelectConnection) -> None:
        super().__init__(conn)
        self.connection = conn
        self._loop = conn.ioloop
        self._on_close: list[Callback] = []
        self._on_return: list[Callback] = []
        self._on_cancel: list[Callback] = []
        self._consumers: dict[str, Callback] = {}
        self._on_confirm: Callback | None = None
        self._seq = 0
        self._closing = False

    def __repr__(self) -> str:
        return f"<memory channel {self.channel_number} of {self.connection.name}>"

    @property
    def is_open(self) -> bool:
        return self.state.open and not self._closing

    # -- Sink -------------------------------------------------------------------

    def deliver(self, consumer_tag: str, tag: int, msg: Message, redelivered: bool) -> None:
        fn = self._consumers.get(consumer_tag)
        if fn is None:
            return
        method = pika.spec.Basic.Deliver(
            consumer_tag, tag, redelivered, msg.exchange, msg.routing_key
        )
        self._loop.add_callback_threadsafe(lambda: fn(self, method, decode_props(msg), msg.body))

    def cancelled(self, consumer_tag: str) -> None:
        """basic.cancel from the broker: pika forgets the consumer, then calls back with
        the method frame."""
        frame = pika.frame.Method(self.channel_number, pika.spec.Basic.Cancel(consumer_tag))

        def notify() -> None:
            self._consumers.pop(consumer_tag, None)
            for cb in list(self._on_cancel):
                cb(frame)

        self._loop.add_callback_threadsafe(notify)

    def closed(self, code: int, text: str) -> None:
        reason = closed_error(code, text)
        self.connection.forget(self)

        def notify() -> None:
            for cb in self._on_close:
                cb(self, reason)

        self._loop.add_callback_threadsafe(notify)

    # -- pika's Channel API -------------------------------------------------------------

    def add_on_close_callback(self, cb: Callback) -> None:
        self._on_close.append(cb)

    def add_on_return_callback(self, cb: Callback) -> None:
        self._on_return.append(cb)

    def add_on_cancel_callback(self, cb: Callback) -> None:
        self._on_cancel.append(cb)

    def _check(self) -> None:
        if not self.is_open:
            raise pika.exceptions.ChannelWrongStateError("Channel is closed.")

    def _then(self, callback: Callback | None, method: Any = None) -> None:
        if callback is not None:
            frame = pika.frame.Method(self.channel_number, method)
            self._loop.add_callback_threadsafe(lambda: callback(frame))

    def _run(self, op: Callable[[], Any]) -> Any:
        """Run a model operation; a broker error closes this channel (its callbacks say why)."""
        self._check()
        try:
            return op()
        except ChannelError as exc:
            self._model.close_channel(self.state, exc.code, exc.text)
            return None

    def basic_qos(
        self,
        prefetch_count: int = 0,
        callback: Callback | None = None,
        global_qos: bool = False,
        **_: Any,
    ) -> None:
        if self._qos(prefetch_count, global_qos):
            self._then(callback, pika.spec.Basic.QosOk())

    def basic_consume(
        self,
        queue: str,
        on_message_callback: Callback,
        auto_ack: bool = False,
        exclusive: bool = False,
        consumer_tag: str | None = None,
        arguments: dict[str, Any] | None = None,
        callback: Callback | None = None,
    ) -> str:
        self._check()
        tag = consumer_tag or f"ctag{self.channel_number}.{id(self):x}.{len(self._consumers)}"
        self._consumers[tag] = on_message_callback
        ok = self._consume(queue, auto_ack, tag, exclusive)
        if ok is not None:
            self._then(callback, pika.spec.Basic.ConsumeOk(tag))
        return tag

    def basic_cancel(self, consumer_tag: str = "", callback: Callback | None = None) -> None:
        self._cancel(consumer_tag)
        self._then(callback, pika.spec.Basic.CancelOk(consumer_tag))

    def tx_select(self, callback: Callback | None = None) -> None:
        self._tx(self._model.tx_select)
        self._then(callback, pika.spec.Tx.SelectOk())

    def tx_commit(self, callback: Callback | None = None) -> None:
        self._tx(self._model.tx_commit)
        self._then(callback, pika.spec.Tx.CommitOk())

    def tx_rollback(self, callback: Callback | None = None) -> None:
        self._tx(self._model.tx_rollback)
        self._then(callback, pika.spec.Tx.RollbackOk())

    def confirm_delivery(
        self, ack_nack_callback: Callback, callback: Callback | None = None
    ) -> None:
        self._check()
        self._on_confirm = ack_nack_callback
        self._then(callback, pika.spec.Confirm.SelectOk())

    def basic_publish(
        self,
        exchange: str,
        routing_key: str,
        body: bytes,
        properties: Any = None,
        mandatory: bool = False,
    ) -> None:
        self._check()
        msg = Message(bytes(body), encode_props(properties), exchange, routing_key)
        result = self._publish(msg, mandatory)
        if result is None:
            return
        returned, refused = result
        if returned:
            method = pika.spec.Basic.Return(312, "NO_ROUTE", exchange, routing_key)
            props = decode_props(msg)
            for cb in list(self._on_return):
                self._loop.add_callback_threadsafe(lambda cb=cb: cb(self, method, props, msg.body))
        if self._on_confirm is not None:
            self._seq += 1
            m = pika.spec.Basic.Nack(self._seq) if refused else pika.spec.Basic.Ack(self._seq)
            frame = pika.frame.Method(self.channel_number, m)
            confirm = self._on_confirm
            self._loop.add_callback_threadsafe(lambda: confirm(frame))

    def queue_declare(
        self,
        queue: str,
        passive: bool = False,
        durable: bool = False,
        exclusive: bool = False,
        auto_delete: bool = False,
        arguments: dict[str, Any] | None = None,
        callback: Callback | None = None,
    ) -> None:
        declared = self._declare_queue(queue, passive, durable, exclusive, arguments)
        if declared is not None:
            self._then(callback, pika.spec.Queue.DeclareOk(*declared))

    def exchange_declare(
        self,
        exchange: str,
        exchange_type: Any = "direct",
        passive: bool = False,
        durable: bool = False,
        auto_delete: bool = False,
        internal: bool = False,
        arguments: dict[str, Any] | None = None,
        callback: Callback | None = None,
    ) -> None:
        if self._declare_exchange(exchange, exchange_type, passive, durable, arguments):
            self._then(callback, pika.spec.Exchange.DeclareOk())

    def queue_bind(
        self,
        queue: str,
        exchange: str,
        routing_key: str | None = None,
        arguments: dict[str, Any] | None = None,
        callback: Callback | None = None,
    ) -> None:
        if self._bind(queue, exchange, routing_key or queue, arguments):
            self._then(callback, pika.spec.Queue.BindOk())

    def close(self, reply_code: int = 200, reply_text: str = "Normal shutdown") -> None:
        if self.is_closed or self._closing:
            raise pika.exceptions.ChannelWrongStateError("Channel is already closing or closed.")
        self._closing = True
        self._model.close_channel(self.state, reply_code, reply_text)


class SelectConnection(PikaConnection):
    """A pika `SelectConnection` on the in-memory broker."""

    def __init__(
        self,
        broker: Any,
        parameters: Any = None,
        on_open_callback: Callback | None = None,
        on_open_error_callback: Callback | None = None,
        on_close_callback: Callback | None = None,
    ) -> None:
        super().__init__(broker, parameters)
        self.ioloop = IOLoop()
        self._on_close = on_close_callback
        self._channels: list[SelectChannel] = []
        self._state = "opening"
        self.server_properties = broker.server_properties()
        refusal = broker.refusal()
        if refusal is not None:
            self._state = "closed"
            err = pika.exceptions.AMQPConnectionError(refusal)
            if on_open_error_callback is not None:
                cb = on_open_error_callback
                self.ioloop.add_callback_threadsafe(lambda: cb(self, err))
            return
        broker.connected(self)
        self._state = "open"
        if on_open_callback is not None:
            cb = on_open_callback
            self.ioloop.add_callback_threadsafe(lambda: cb(self))

    @property
    def is_open(self) -> bool:
        return self._state == "open"

    @property
    def is_closed(self) -> bool:
        return self._state == "closed"

    @property
    def is_closing(self) -> bool:
        return self._state == "closing"

    def forget(self, ch: SelectChannel) -> None:
        if ch in self._channels:
            self._channels.remove(ch)

    def channel(
        self, channel_number: int | None = None, on_open_callback: Callback | None = None
    ) -> SelectChannel:
        if not self.is_open:
            raise pika.exceptions.ConnectionWrongStateError("Connection is not open")
        ch = SelectChannel(self)
        self._channels.append(ch)
        if on_open_callback is not None:
            cb = on_open_callback
            self.ioloop.add_callback_threadsafe(lambda: cb(ch))
        return ch

    def close(self, reply_code: int = 200, reply_text: str = "Normal shutdown") -> None:
        if not self.is_open:
            raise pika.exceptions.ConnectionWrongStateError("Connection is closed or closing")
        self._shut(pika.exceptions.ConnectionClosedByClient(reply_code, reply_text))

    def force_close(self, text: str) -> None:
        """The broker closes this connection (CONNECTION_FORCED); any thread."""
        reason = pika.exceptions.ConnectionClosedByBroker(320, f"CONNECTION_FORCED - {text}")

        def shut() -> None:
            if self.is_open:
                self._shut(reason)

        self.ioloop.add_callback_threadsafe(shut)

    def _shut(self, reason: BaseException) -> None:
        self._state = "closing"
        code = getattr(reason, "reply_code", 200)
        text = getattr(reason, "reply_text", "")
        for ch in list(self._channels):
            self.model.close_channel(ch.state, code, text)
        self.broker.disconnected(self)

        def done() -> None:
            self._state = "closed"
            if self._on_close is not None:
                self._on_close(self, reason)

        self.ioloop.add_callback_threadsafe(done)
