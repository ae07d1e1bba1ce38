"""pika's BlockingConnection on the in-memory broker: what pull mode, the DLQ tool and
the test kit's helpers (and a test's own code, through `InMemoryBroker.connect()`)
use, synchronously, raising pika's exceptions."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pika.exceptions
import pika.frame
import pika.spec
from pika.adapters.blocking_connection import ReturnedMessage

from ._mem_pikaio import PikaChannel, PikaConnection, closed_error, decode_props, encode_props
from ._mem_state import ChannelError, Message


class _Impl:
    """What ackkit reads of a BlockingChannel's `_impl` (its connection's parameters)."""

    def __init__(self, connection: Any) -> None:
        self.connection = connection
        self.server_properties: dict[str, Any] = {}


class BlockingChannel(PikaChannel):
    """A pika `BlockingChannel` on the in-memory broker (synchronous, any one thread)."""

    def __init__(self, conn: BlockingConnection) -> None:
        super().__init__(conn)
        self.connection = conn
        self._confirm = False
        self._reason: pika.exceptions.ChannelClosed | None = None
        self._impl = _Impl(conn)

    # -- Sink -------------------------------------------------------------------------

    def deliver(self, consumer_tag: str, tag: int, msg: Message, redelivered: bool) -> None:
        pass  # basic_get only

    def cancelled(self, consumer_tag: str) -> None:
        pass  # basic_get only: it has no consumers

    def closed(self, code: int, text: str) -> None:
        self._reason = closed_error(code, text)

    # -- pika's BlockingChannel API ---------------------------------------------------------

    @property
    def is_open(self) -> bool:
        return self.state.open

    def _run(self, op: Callable[[], Any]) -> Any:
        if not self.state.open:
            raise pika.exceptions.ChannelWrongStateError("Channel is closed.")
        try:
            return op()
        except ChannelError as exc:
            self._model.close_channel(self.state, exc.code, exc.text)
            raise pika.exceptions.ChannelClosedByBroker(exc.code, exc.text) from None

    def _ok(self, method: Any) -> pika.frame.Method:
        return pika.frame.Method(self.channel_number, method)

    def confirm_delivery(self) -> None:
        self._confirm = True

    def basic_qos(self, prefetch_count: int = 0, global_qos: bool = False, **_: Any) -> None:
        self._qos(prefetch_count, global_qos)

    def basic_publish(
        self,
        exchange: str,
        routing_key: str,
        body: bytes,
        properties: Any = None,
        mandatory: bool = False,
    ) -> None:
        msg = Message(bytes(body), encode_props(properties), exchange, routing_key)
        result = self._publish(msg, mandatory)
        assert result is not None  # (_run raises instead)
        returned, refused = result
        if not self._confirm:
            return
        if returned:
            method = pika.spec.Basic.Return(312, "NO_ROUTE", exchange, routing_key)
            raise pika.exceptions.UnroutableError(
                [ReturnedMessage(method, decode_props(msg), msg.body)]
            )
        if refused:
            raise pika.exceptions.NackError([ReturnedMessage(None, decode_props(msg), msg.body)])

    def basic_get(self, queue: str, auto_ack: bool = False) -> tuple[Any, Any, Any]:
        got = self._get(queue, auto_ack)
        if got is None:
            return None, None, None
        tag, msg, left = got
        method = pika.spec.Basic.GetOk(tag, msg.redelivered, msg.exchange, msg.routing_key, left)
        return method, decode_props(msg), msg.body

    def queue_declare(
        self,
        queue: str,
        passive: bool = False,
        durable: bool = False,
        exclusive: bool = False,
        auto_delete: bool = False,
        arguments: dict[str, Any] | None = None,
    ) -> pika.frame.Method:
        declared = self._declare_queue(queue, passive, durable, exclusive, arguments)
        assert declared is not None  # (_run raises instead)
        return self._ok(pika.spec.Queue.DeclareOk(*declared))

    def queue_purge(self, queue: str) -> pika.frame.Method:
        n = self._run(lambda: self._model.queue_purge(queue))
        return self._ok(pika.spec.Queue.PurgeOk(n))

    def queue_delete(self, queue: str, if_unused: bool = False, if_empty: bool = False) -> Any:
        n = self._run(lambda: self._model.queue_delete(queue))
        return self._ok(pika.spec.Queue.DeleteOk(n))

    def exchange_declare(
        self,
        exchange: str,
        exchange_type: Any = "direct",
        passive: bool = False,
        durable: bool = False,
        auto_delete: bool = False,
        internal: bool = False,
        arguments: dict[str, Any] | None = None,
    ) -> pika.frame.Method:
        self._declare_exchange(exchange, exchange_type, passive, durable, arguments)
        return self._ok(pika.spec.Exchange.DeclareOk())

    def exchange_delete(self, exchange: str | None = None, if_unused: bool = False) -> Any:
        self._run(lambda: self._model.exchange_delete(exchange or ""))
        return self._ok(pika.spec.Exchange.DeleteOk())

    def queue_bind(
        self,
        queue: str,
        exchange: str,
        routing_key: str | None = None,
        arguments: dict[str, Any] | None = None,
    ) -> pika.frame.Method:
        self._bind(queue, exchange, routing_key or queue, arguments)
        return self._ok(pika.spec.Queue.BindOk())

    def close(self, reply_code: int = 200, reply_text: str = "Normal shutdown") -> None:
        self._model.close_channel(self.state, reply_code, reply_text)

    def __enter__(self) -> BlockingChannel:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.is_open:
            self.close()


class BlockingConnection(PikaConnection):
    """A pika `BlockingConnection` on the in-memory broker."""

    def __init__(self, broker: Any, parameters: Any = None) -> None:
        refusal = broker.refusal()
        if refusal is not None:
            raise pika.exceptions.AMQPConnectionError(refusal)
        super().__init__(broker, parameters)
        self._channels: list[BlockingChannel] = []
        self._open = True
        self._impl = _Impl(self)
        self._impl.server_properties = broker.server_properties()
        broker.connected(self)

    @property
    def is_open(self) -> bool:
        return self._open

    @property
    def is_closed(self) -> bool:
        return not self._open

    def channel(self, channel_number: int | None = None) -> BlockingChannel:
        if not self._open:
            raise pika.exceptions.ConnectionWrongStateError("Connection is closed")
        ch = BlockingChannel(self)
        self._channels.append(ch)
        return ch

    def process_data_events(self, time_limit: float = 0) -> None:
        if time_limit:
            time.sleep(min(time_limit, 0.01))

    def sleep(self, duration: float) -> None:
        time.sleep(duration)

    def force_close(self, text: str) -> None:
        self.close(320, f"CONNECTION_FORCED - {text}")

    def close(self, reply_code: int = 200, reply_text: str = "Normal shutdown") -> None:
        if not self._open:
            raise pika.exceptions.ConnectionWrongStateError("Connection is closed")
        self._open = False
        for ch in self._channels:
            self.model.close_channel(ch.state, reply_code, reply_text)
        self.broker.disconnected(self)

    def __enter__(self) -> BlockingConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._open:
            self.close()
