"""aiormq's face of the in-memory broker: the connection and channels AsyncApp uses.

AsyncApp's runtime and `AsyncPullConnection` talk to aiormq (aio-pika's
transport); these classes answer the same calls on the in-memory broker, raise
aiormq's exceptions, and deliver aiormq `DeliveredMessage`s whose properties
pamqp decoded from the bytes the publisher's properties encode to. As in
aiormq, a consumer callback runs as a task of its channel, and a closed
channel cancels its tasks.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import struct
from types import SimpleNamespace
from typing import Any

import aiormq.exceptions
from aiormq.abc import DeliveredMessage
from aiormq.channel import exception_by_code
from pamqp import commands as spec
from pamqp.header import ContentHeader

from .._async import _frames as frames
from .._core import wire
from ._mem_channel import ModelChannel
from ._mem_model import Model
from ._mem_state import ChannelError, Message

FRAME_MAX = 131072


def encode_props(props: Any) -> bytes:
    if props is None:
        return wire.encode_properties({})
    data: bytes = props.marshal()
    return data


def decode_header(msg: Message) -> tuple[ContentHeader, str | None]:
    """pamqp's content header of `msg`, and why it could not be read (or None)."""
    header = ContentHeader()
    try:
        header.unmarshal(struct.pack(">HHQ", 60, 0, len(msg.body)) + msg.props)
    except Exception as exc:  # what the runtime's frame filter marks unreadable
        return ContentHeader(0, len(msg.body), frames.minimal_properties()), f"{exc!r:.200}"
    return header, None


def _closed(code: int, text: str) -> BaseException:
    return exception_by_code(spec.Channel.Close(reply_code=code, reply_text=text))


class AioChannel(ModelChannel):
    """An aiormq `Channel` on the in-memory broker."""

    def __init__(self, conn: AioConnection, number: int, confirms: bool) -> None:
        self.connection = conn
        self.number = number
        self.loop = conn.loop
        self._model: Model = conn.model
        self.publisher_confirms = confirms
        self.state = conn.model.open_channel(self, conn.name)
        self.closing: asyncio.Future[None] = self.loop.create_future()
        self.closing.add_done_callback(_retrieve)
        self._closed = False
        self._consumers: dict[str, Any] = {}
        self.on_consumer_cancel_callbacks: set[Any] = set()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._ctags = itertools.count(1)

    @property
    def is_closed(self) -> bool:
        return self._closed

    # -- Sink (any thread, under the model's lock) ----------------------------------------

    def deliver(self, consumer_tag: str, tag: int, msg: Message, redelivered: bool) -> None:
        cb = self._consumers.get(consumer_tag)
        if cb is None or self.loop.is_closed():
            return
        method = spec.Basic.Deliver(
            consumer_tag=consumer_tag,
            delivery_tag=tag,
            redelivered=redelivered,
            exchange=msg.exchange,
            routing_key=msg.routing_key,
        )
        self.loop.call_soon_threadsafe(self._run_consumer, cb, method, msg)

    def _run_consumer(self, cb: Any, method: Any, msg: Message) -> None:
        if self._closed:
            return
        header, why = decode_header(msg)
        if why is not None:
            self.connection.reasons.add(self.number, method.delivery_tag, why)
        dm = DeliveredMessage(delivery=method, header=header, body=msg.body, channel=self)  # type: ignore[arg-type]
        task = self.loop.create_task(cb(dm))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def cancelled(self, consumer_tag: str) -> None:
        with contextlib.suppress(RuntimeError):  # its loop is closed: nobody to tell
            self.loop.call_soon_threadsafe(self._on_cancel, consumer_tag)

    def _on_cancel(self, consumer_tag: str) -> None:
        """basic.cancel from the broker, as aiormq hands it on: the consumer is
        forgotten and every cancel callback gets the frame (a coroutine one as a task)."""
        if self._closed:
            return
        self._consumers.pop(consumer_tag, None)
        frame = spec.Basic.Cancel(consumer_tag=consumer_tag, nowait=True)
        for cb in list(self.on_consumer_cancel_callbacks):
            result = cb(frame)
            if asyncio.iscoroutine(result):
                task = self.loop.create_task(result)
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)

    def closed(self, code: int, text: str) -> None:
        self._closed = True
        with contextlib.suppress(RuntimeError):  # its loop is closed: nobody to tell
            self.loop.call_soon_threadsafe(self._finish_close, code, text)

    def _finish_close(self, code: int, text: str) -> None:
        self.connection.channels.discard(self)
        if not self.closing.done():
            if code in (0, 200):
                self.closing.set_result(None)
            else:
                self.closing.set_exception(_closed(code, text))
        for t in list(self._tasks):
            t.cancel()

    # -- aiormq's Channel API ----------------------------------------------------------------

    def _run(self, op: Any) -> Any:
        if self._closed:
            raise aiormq.exceptions.ChannelInvalidStateError(f"channel {self.number} closed")
        try:
            return op()
        except ChannelError as exc:
            self._model.close_channel(self.state, exc.code, exc.text)
            raise _closed(exc.code, exc.text) from None

    async def basic_qos(
        self, prefetch_count: int = 0, global_: bool = False, **_: Any
    ) -> spec.Basic.QosOk:
        self._qos(prefetch_count, global_)
        return spec.Basic.QosOk()

    async def basic_consume(
        self,
        queue: str,
        consumer_callback: Any,
        *,
        no_ack: bool = False,
        exclusive: bool = False,
        consumer_tag: str | None = None,
        **_: Any,
    ) -> spec.Basic.ConsumeOk:
        tag = consumer_tag or f"ctag{self.number}.{next(self._ctags)}"
        self._consumers[tag] = consumer_callback
        self._consume(queue, no_ack, tag, exclusive)
        return spec.Basic.ConsumeOk(consumer_tag=tag)

    async def basic_cancel(self, consumer_tag: str, **_: Any) -> spec.Basic.CancelOk:
        self._cancel(consumer_tag)
        self._consumers.pop(consumer_tag, None)
        return spec.Basic.CancelOk(consumer_tag=consumer_tag)

    async def basic_ack(self, delivery_tag: int, multiple: bool = False, wait: bool = True) -> None:
        self._settle("ack", delivery_tag, multiple, False)

    async def basic_nack(
        self, delivery_tag: int, multiple: bool = False, requeue: bool = True, wait: bool = True
    ) -> None:
        self._settle("nack", delivery_tag, multiple, requeue)

    async def basic_reject(
        self, delivery_tag: int, *, requeue: bool = True, wait: bool = True
    ) -> None:
        self._settle("reject", delivery_tag, False, requeue)

    async def tx_select(self, **_: Any) -> spec.Tx.SelectOk:
        self._tx(self._model.tx_select)
        return spec.Tx.SelectOk()

    async def tx_commit(self, **_: Any) -> spec.Tx.CommitOk:
        self._tx(self._model.tx_commit)
        return spec.Tx.CommitOk()

    async def tx_rollback(self, **_: Any) -> spec.Tx.RollbackOk:
        self._tx(self._model.tx_rollback)
        return spec.Tx.RollbackOk()

    async def queue_declare(
        self,
        queue: str = "",
        passive: bool = False,
        durable: bool = False,
        exclusive: bool = False,
        auto_delete: bool = False,
        arguments: dict[str, Any] | None = None,
        **_: Any,
    ) -> spec.Queue.DeclareOk:
        declared = self._declare_queue(queue, passive, durable, exclusive, arguments)
        assert declared is not None  # (_run raises instead)
        name, messages, consumers = declared
        return spec.Queue.DeclareOk(queue=name, message_count=messages, consumer_count=consumers)

    async def exchange_declare(
        self,
        exchange: str,
        exchange_type: Any = "direct",
        passive: bool = False,
        durable: bool = False,
        auto_delete: bool = False,
        internal: bool = False,
        arguments: dict[str, Any] | None = None,
        **_: Any,
    ) -> spec.Exchange.DeclareOk:
        self._declare_exchange(exchange, exchange_type, passive, durable, arguments)
        return spec.Exchange.DeclareOk()

    async def queue_bind(
        self,
        queue: str,
        exchange: str,
        routing_key: str = "",
        arguments: dict[str, Any] | None = None,
        **_: Any,
    ) -> spec.Queue.BindOk:
        self._bind(queue, exchange, routing_key, arguments)
        return spec.Queue.BindOk()

    async def basic_publish(
        self,
        body: bytes,
        *,
        exchange: str = "",
        routing_key: str = "",
        properties: Any = None,
        mandatory: bool = False,
        **_: Any,
    ) -> Any:
        msg = Message(bytes(body), encode_props(properties), exchange, routing_key)
        result = self._publish(msg, mandatory)
        assert result is not None  # (_run raises instead)
        returned, refused = result
        if returned:
            header, _why = decode_header(msg)
            ret = spec.Basic.Return(
                reply_code=312, reply_text="NO_ROUTE", exchange=exchange, routing_key=routing_key
            )
            dm = DeliveredMessage(delivery=ret, header=header, body=msg.body, channel=self)  # type: ignore[arg-type]
            raise aiormq.exceptions.PublishError(dm, ret)
        if not self.publisher_confirms:
            return None
        return spec.Basic.Nack(delivery_tag=0) if refused else spec.Basic.Ack(delivery_tag=0)

    async def basic_get(self, queue: str = "", no_ack: bool = False, **_: Any) -> DeliveredMessage:
        got = self._get(queue, no_ack)
        if got is None:
            empty = spec.Basic.GetEmpty()
            return DeliveredMessage(delivery=empty, header=ContentHeader(), body=b"", channel=self)  # type: ignore[arg-type]
        tag, msg, left = got
        method = spec.Basic.GetOk(
            delivery_tag=tag,
            redelivered=msg.redelivered,
            exchange=msg.exchange,
            routing_key=msg.routing_key,
            message_count=left,
        )
        header, why = decode_header(msg)
        if why is not None:
            self.connection.reasons.add(self.number, tag, why)
        return DeliveredMessage(delivery=method, header=header, body=msg.body, channel=self)  # type: ignore[arg-type]

    async def close(self, exc: BaseException | None = None, **_: Any) -> None:
        if not self._closed:
            self._model.close_channel(self.state, 200, "Normal shutdown")
        with contextlib.suppress(BaseException):
            await asyncio.shield(self.closing)


class AioConnection:
    """aio-pika's connection and aiormq's, in one object, on the in-memory broker."""

    def __init__(self, broker: Any, name: str) -> None:
        self.broker = broker
        self.model: Model = broker.model
        self.name = name
        self.loop = asyncio.get_running_loop()
        self.closing: asyncio.Future[None] = self.loop.create_future()
        self.closing.add_done_callback(_retrieve)
        self.channels: set[AioChannel] = set()
        self.connection_tune = SimpleNamespace(frame_max=FRAME_MAX)
        self.url = SimpleNamespace(user="guest")
        self.server_properties = broker.server_properties()
        self.reasons = frames.Reasons()
        frames._REASONS[self] = self.reasons
        self.transport = SimpleNamespace(connection=self)
        broker.connected(self)

    @property
    def is_closed(self) -> bool:
        return self.closing.done()

    async def channel(
        self, channel_number: int | None = None, publisher_confirms: bool = True, **_: Any
    ) -> AioChannel:
        if self.is_closed:
            raise aiormq.exceptions.ConnectionClosed(320, "connection closed")
        ch = AioChannel(self, channel_number or len(self.channels) + 1, publisher_confirms)
        self.channels.add(ch)
        return ch

    def force_close(self, text: str) -> None:
        """The broker closes this connection (CONNECTION_FORCED); any thread."""
        exc = aiormq.exceptions.ConnectionClosed(320, f"CONNECTION_FORCED - {text}")
        self.loop.call_soon_threadsafe(self._shut, exc)

    def _shut(self, exc: BaseException | None) -> None:
        if self.closing.done():
            return
        code, text = (200, "Normal shutdown") if exc is None else (320, str(exc))
        for ch in list(self.channels):
            self.model.close_channel(ch.state, code, text)
        self.broker.disconnected(self)
        if exc is None:
            self.closing.set_result(None)
        else:
            self.closing.set_exception(exc)

    async def close(self, exc: BaseException | None = None, **_: Any) -> None:
        self._shut(None)
        await asyncio.sleep(0)


def _retrieve(fut: asyncio.Future[Any]) -> None:
    if not fut.cancelled():
        fut.exception()  # a close reason nobody awaited is not an "unretrieved" error
