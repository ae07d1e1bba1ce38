"""An AMQP 1.0 connection, as the pika `SelectConnection` the App's runtime drives
(`ackkit._sync.engine.Engine._serve_one`): opened when its loop starts, its callbacks
called on the I/O thread, its channels sessions (`channel.Channel`).

proton is told `reconnect=False`: a connection that fails or ends is over, and the
runtime connects again with its own backoff and node rotation, as it does for 0-9-1.
A RabbitMQ 3.x node answers AMQP 1.0 with its 0-9-1 protocol header; the runtime has
refused such a broker before (by the version its topology connection reported).
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable
from typing import Any

import pika.exceptions
from proton import Handler, symbol
from proton.reactor import Container

from .._connection.url import mask_text
from .channel import Channel, condition_of, reply_code
from .loop import Loop

log = logging.getLogger("ackkit")


def _channel(event: Any) -> Channel | None:
    """The channel (session) of a link event, if it is one of ours."""
    ch = event.link.session.context
    return ch if isinstance(ch, Channel) else None


class _Events(Handler):
    """proton's events for one connection, handed to the stand-ins."""

    def __init__(self, conn: Connection) -> None:
        super().__init__()
        self.conn = conn

    def on_ackkit_calls(self, _event: Any) -> None:
        self.conn.ioloop.run_calls()

    def on_connection_remote_open(self, event: Any) -> None:
        self.conn.remote_opened(event.connection)

    def on_connection_remote_close(self, event: Any) -> None:
        c = event.connection
        self.conn.remote_closed(condition_of(c))
        if c.state & c.LOCAL_ACTIVE:
            c.close()

    def on_session_remote_open(self, event: Any) -> None:
        ch = event.session.context
        if isinstance(ch, Channel):
            ch.opened()

    def on_session_remote_close(self, event: Any) -> None:
        ssn = event.session
        ch = ssn.context
        if isinstance(ch, Channel):
            ch.closed_by_broker(condition_of(ssn))
        if ssn.state & ssn.LOCAL_ACTIVE:
            ssn.close()

    def on_link_remote_open(self, event: Any) -> None:
        if (ch := _channel(event)) is not None:
            ch.link_opened(event.link)

    def on_link_remote_close(self, event: Any) -> None:
        if (ch := _channel(event)) is not None:
            ch.link_closed(event.link)

    on_link_remote_detach = on_link_remote_close

    def on_link_flow(self, event: Any) -> None:
        if (ch := _channel(event)) is not None:
            ch.link_flow(event.link)

    def on_delivery(self, event: Any) -> None:
        if (ch := _channel(event)) is not None:
            ch.delivery(event.delivery)

    def on_transport_error(self, event: Any) -> None:
        cond = condition_of(event.transport, "condition")
        self.conn.transport_failed(cond)

    def on_transport_closed(self, event: Any) -> None:
        self.conn.transport_failed(None)


class Connection:
    """One AMQP 1.0 connection, with the pika calls the runtime makes of it."""

    def __init__(
        self,
        params: Any,
        *,
        on_open_callback: Callable[[Any], None],
        on_open_error_callback: Callable[[Any, BaseException], None],
        on_close_callback: Callable[[Any, BaseException], None],
    ) -> None:
        self.params = params
        self._on_open = on_open_callback
        self._on_open_error = on_open_error_callback
        self._on_close = on_close_callback
        self.handler = _Events(self)
        self.container = Container()
        self.container.container_id = getattr(params, "amqp10_container_id", None) or None
        self.ioloop = Loop(self.container)
        self.is_open = False
        self.is_closed = False
        self._ended = False
        self.server_properties: dict[str, Any] = {}
        self._numbers = itertools.count(1)
        self.channels: list[Channel] = []
        creds = params.credentials
        kw: dict[str, Any] = {
            "reconnect": False,
            # proton closes after `heartbeat` seconds without a frame and asks the broker
            # for one every half of that: twice pika's interval tolerates what pika does
            "heartbeat": 2 * params.heartbeat if params.heartbeat else None,
            "sasl_enabled": True,
            "allowed_mechs": "PLAIN",
            "allow_insecure_mechs": True,
            "user": creds.username,
            "password": creds.password,
            "properties": {
                symbol("connection_name"): str(
                    (params.client_properties or {}).get("connection_name", "ackkit")
                ),
                symbol("product"): "ackkit",
            },
        }
        if params.virtual_host and params.virtual_host != "/":
            kw["virtual_host"] = f"vhost:{params.virtual_host}"
        self.proton = self.container.connect(
            url=f"amqp://{_host(params.host)}:{params.port}", handler=self.handler, **kw
        )
        self.ioloop.bind(self.handler)

    # -- pika's connection calls ------------------------------------------------------

    def channel(self, on_open_callback: Callable[[Any], None]) -> Channel:
        ch = Channel(self, next(self._numbers), on_open_callback)
        self.channels.append(ch)
        return ch

    def close(self, reply_code: int = 200, reply_text: str = "Normal shutdown") -> None:
        if self.is_closed or not self.is_open:
            return
        self.is_open = False
        for ch in list(self.channels):
            ch.close()
        self.proton.close()

    # -- events (I/O thread) -------------------------------------------------------------

    def forget(self, ch: Channel) -> None:
        if ch in self.channels:
            self.channels.remove(ch)

    def remote_opened(self, c: Any) -> None:
        props = c.remote_properties or {}
        self.server_properties = {str(k): _text(v) for k, v in props.items()}
        self.is_open = True
        self._on_open(self)

    def remote_closed(self, condition: Any) -> None:
        # 320 (CONNECTION_FORCED), as 0-9-1 says it: the channels did not fail on their own
        text = "closed" if condition is None else reply_code(condition)[1]
        self._end(pika.exceptions.ConnectionClosedByBroker(320, text), condition)

    def transport_failed(self, condition: Any) -> None:
        if condition is None:
            why = "connection closed"
        else:
            why = mask_text(f"{condition.name}: {condition.description or ''}")
        self._end(pika.exceptions.AMQPConnectionError(why))

    def _end(self, reason: BaseException, condition: Any = None) -> None:
        if self._ended:
            return
        self._ended = True
        opened = bool(self.server_properties)
        self.is_open = False
        self.is_closed = True
        for ch in list(self.channels):
            ch.connection_lost(reason, condition)
        if opened:
            self._on_close(self, reason)
        else:
            self._on_open_error(self, reason)


def _text(v: Any) -> Any:
    if isinstance(v, (bytes, memoryview)):
        return bytes(v).decode("utf-8", "replace")
    return str(v) if isinstance(v, str) else v


def _host(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host
