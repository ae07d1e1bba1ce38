"""Small aio-pika / aiormq helpers shared by AsyncApp and pull mode.

The hot path uses aiormq channels (aio-pika's transport) directly: the
consumer callback gets aiormq's DeliveredMessage, and settles are single
frames on the channel the delivery came from. Connections are opened with
`aio_pika.connect` (URL parsing, client properties, timeouts).
"""

from __future__ import annotations

import contextlib
import logging
import ssl
from collections.abc import Container, Iterable, Mapping
from typing import Any

import aio_pika
import aiormq
import aiormq.exceptions
from aiormq.abc import AbstractChannel, AbstractConnection
from pamqp import commands as spec
from yarl import URL

from .._connection.inmemory import broker_for
from .._connection.io import ConnectFailed, FatalConnectError
from .._connection.tls import client_tls, handshake_hint, tls_failure
from .._connection.url import mask_text, mask_url
from .._core import wire
from .._core.actions import Republish
from .._core.exchanges import BindingDecl, DeclareQueue, ExchangeDecl, Plan
from .._core.listener import QueueSpec
from .._interpreter import copying
from .._interpreter.preparing import NO_EXCHANGES, Exists, declarations, refused
from .._messages.delivery import DeliveryBase
from ._transport import SafeConnection

log = logging.getLogger("ackkit")

PROPERTY_FIELDS = spec.Basic.Properties.__slots__
FATAL_CONNECT = (
    aiormq.exceptions.AuthenticationError,
    aiormq.exceptions.ProbableAuthenticationError,
    aiormq.exceptions.ConnectionNotAllowed,
)
CHANNEL_GONE = (
    aiormq.exceptions.AMQPError,
    aiormq.exceptions.ChannelInvalidStateError,
    ConnectionError,
    RuntimeError,
)
"""What a send on a channel that closed under us raises."""


async def open_connection(
    url: str,
    *,
    heartbeat: int | None,
    name: str,
    timeout: float,
    tls: tuple[ssl.SSLContext, str | None] | None = None,
) -> tuple[aio_pika.abc.AbstractConnection, AbstractConnection]:
    """An aio-pika connection and its aiormq connection; ConnectFailed / FatalConnectError.

    amqps:// URLs use `tls` (from `client_tls`), else the system's trust store."""
    memory = broker_for(url)
    if memory is not None:  # ackkit.testing.InMemoryBroker
        conn = memory.aio_connection(name)
        return conn, conn
    u = URL(url)
    if heartbeat is not None and "heartbeat" not in u.query:
        u = u.update_query(heartbeat=heartbeat)
    tls = tls or client_tls(url, None)
    try:
        conn = await aio_pika.connect(
            u,
            connection_class=SafeConnection,  # a frame pamqp cannot read does not kill it
            timeout=timeout,
            client_properties={"connection_name": name},
            ssl_context=tls[0] if tls else None,
        )
    except FATAL_CONNECT as exc:
        raise FatalConnectError(
            f"connecting to {mask_url(url)} was refused: {mask_text(repr(exc))}"
        ) from None
    except aiormq.exceptions.InvalidFrameError as exc:
        text = str(exc)
        if "Connection.OpenOk" in text and "Connection.Close" in text:
            # connection.open refused (NOT_ALLOWED): no such vhost, or no access to it
            raise FatalConnectError(
                f"access denied on {mask_url(url)}: the broker refused the virtual host"
            ) from None
        raise ConnectFailed(mask_text(repr(exc))) from None
    except Exception as exc:  # OSError, AMQPConnectionError, TimeoutError, ...
        bad_tls = tls_failure(exc, url)
        if bad_tls is not None:  # retrying cannot fix a certificate
            raise FatalConnectError(bad_tls) from None
        raise ConnectFailed(mask_text(repr(exc)) + handshake_hint(exc, url)) from None
    transport = conn.transport
    if transport is None:  # pragma: no cover - closed between connect and here
        raise ConnectFailed("connection closed while opening")
    return conn, transport.connection


class ChannelNumbers:
    """Channel numbers that are not reused soon on one connection.

    A frame queued for a channel that has just closed must never reach a new
    channel that got the same number: a stale delivery tag there closes the new
    channel with PRECONDITION_FAILED. Numbers go up to the connection's channel_max
    (`limit`), then start again at 1, skipping those still open (`in_use`): a standby
    listener opens a channel every few seconds, for as long as it waits.
    """

    __slots__ = ("_in_use", "_limit", "_next")

    def __init__(self, limit: int = 65535, in_use: Container[int] = ()) -> None:
        self._next = 1
        self._limit = max(1, min(limit or 65535, 65535))
        self._in_use = in_use

    @classmethod
    def of(cls, conn: AbstractConnection) -> ChannelNumbers:
        """Numbers for `conn`: up to its negotiated channel_max, skipping its open channels."""
        tune = getattr(conn, "connection_tune", None)
        return cls(getattr(tune, "channel_max", 0) or 65535, getattr(conn, "channels", {}))

    def take(self) -> int:
        for _ in range(self._limit):
            n = self._next
            self._next = n + 1 if n < self._limit else 1
            if n not in self._in_use:
                return n
        raise ConnectionError(f"every channel number up to channel_max={self._limit} is open")


_PAMQP_NAMES = {"message_type": "type"}


class WireProperties(spec.Basic.Properties):
    """Basic properties aiormq sends as ackkit's encoder wrote them (`wire`): pamqp
    writes every float as a single-precision one and cannot encode `bytes`.

    aiormq gives a copy without message_id a random one (it matches basic.return by
    message_id): it is written too, so a returned copy is still recognised."""

    def __init__(self, props: Mapping[str, Any], encoded: bytes | None = None) -> None:
        """`encoded` is not used: aiormq may give the copy a message_id before it is
        written (`marshal`)."""
        super().__init__(message_id=props.get("message_id"))
        self.mapping = dict(props)

    def marshal(self) -> bytes:
        p = self.mapping
        if p.get("message_id") is None and self.message_id:
            p = {**p, "message_id": self.message_id}
        return wire.encode_properties(p)


def property_map(props: Any) -> dict[str, Any]:
    """AMQP property name -> value of pamqp Basic.Properties."""
    if props is None:
        return {}
    return {_PAMQP_NAMES.get(f, f): getattr(props, f, None) for f in PROPERTY_FIELDS}


def measure(props: Mapping[str, Any]) -> bytes:
    """What aiormq sends for a copy with `props` (a 32-character message_id when it
    has none: aiormq adds one)."""
    if props.get("message_id") is None:
        props = {**props, "message_id": "0" * 32}
    return wire.encode_properties(props)


copy_properties = copying.CopyProperties(property_map, measure, WireProperties)
"""`copy_properties(props, set_headers, *, purpose, minimal, frame_max, user)`: the
properties of a copy of a delivery with pamqp `props`: what `ackkit._core.copies`
decides, ready for aiormq."""


def copy_options(a: Republish, ch: AbstractChannel) -> dict[str, Any]:
    """copy_properties keywords for Republish `a` published on aiormq channel `ch`."""
    conn: Any = ch.connection
    tune = getattr(conn, "connection_tune", None)
    url = getattr(conn, "url", None)
    return copying.copy_options(a, getattr(tune, "frame_max", 0) or 0, getattr(url, "user", None))


async def publish_copy(
    ch: AbstractChannel, a: Republish, d: DeliveryBase, timeout: float = 30.0
) -> tuple[bool, bool, str | None, str | None]:
    """Publish the copy a Republish asks for on a confirm channel (declaring its queue
    first when asked). Returns (confirmed, unroutable, error, lost) for
    `ListenerCore.republished(token, ok, unroutable=..., error=..., lost=...)`:
    unroutable when it came back with basic.return; error when it could not be built;
    lost when the channel closed (or no answer came) first: why, in the broker's words."""
    try:
        props = copy_properties(
            None if a.minimal else d.properties, a.set_headers, **copy_options(a, ch)
        )
    except Exception as exc:
        why = f"{a.purpose} copy not publishable: {mask_text(repr(exc))[:300]}"
        log.error("republish to %r: %s", a.routing_key, why)
        return False, False, why, None
    try:
        if a.declare is not None:
            name, args = a.declare
            await ch.queue_declare(name, durable=True, arguments=args or None, timeout=timeout)
        confirmed, returned = await confirmed_publish(
            ch, d.body, a.exchange, a.routing_key, props, mandatory=True, timeout=timeout
        )
    except (TimeoutError, *CHANNEL_GONE) as exc:
        why = mask_text(repr(exc))[:500]
        log.warning("republish to %r failed: %s", a.routing_key, why)
        return False, False, None, why
    if returned:
        log.warning("republish to %r returned by the broker", a.routing_key)
    return confirmed, returned, None, None


async def confirmed_publish(
    ch: AbstractChannel,
    body: bytes,
    exchange: str,
    routing_key: str,
    props: spec.Basic.Properties,
    *,
    mandatory: bool,
    timeout: float,
) -> tuple[bool, bool]:
    """One publish on a confirm channel: (confirmed, returned). Raises TimeoutError or one
    of CHANNEL_GONE when no answer came."""
    try:
        conf = await ch.basic_publish(
            body,
            exchange=exchange,
            routing_key=routing_key,
            properties=props,
            mandatory=mandatory,
            timeout=timeout,
        )
    except aiormq.exceptions.PublishError:  # basic.return
        return False, True
    except aiormq.exceptions.DeliveryError:  # basic.nack
        return False, False
    return isinstance(conf, spec.Basic.Ack), False


async def declare_queues(
    conn: AbstractConnection,
    numbers: ChannelNumbers,
    own: Iterable[QueueSpec],
    user: Iterable[tuple[str, dict[str, Any]]] = (),
    existing: Iterable[str] = (),
    exchanges: Plan = NO_EXCHANGES,
) -> None:
    """Carry out `preparation(...)` (`ackkit._core.exchanges`): the `existing` queues
    checked, then the exchanges, the listeners' queues, ackkit's own, the bindings, each
    on a throwaway channel: a refusal (406, 403, 404) costs that channel only and
    raises TopologyConflict."""
    for step in declarations(own, user, existing, exchanges):
        if isinstance(step, Exists):
            step.exists = await _exists(conn, numbers, step.name)
        elif isinstance(step, ExchangeDecl):
            await _exchange(conn, numbers, step)
        elif isinstance(step, DeclareQueue):
            await _declare(conn, numbers, step)
        else:
            await _bind(conn, numbers, step)


async def _bind(conn: AbstractConnection, numbers: ChannelNumbers, b: BindingDecl) -> None:
    ch = await conn.channel(numbers.take(), publisher_confirms=False)
    try:
        await ch.queue_bind(
            b.queue, b.exchange, routing_key=b.routing_key, arguments=dict(b.arguments) or None
        )
    except REFUSED as exc:
        raise refused(b, str(exc)) from None
    await _close(ch)


REFUSED = (
    aiormq.exceptions.ChannelPreconditionFailed,
    aiormq.exceptions.ChannelAccessRefused,
    aiormq.exceptions.ChannelNotFoundEntity,
)
"""What a declare or bind the broker refuses raises (406, 403, 404)."""


async def _exchange(conn: AbstractConnection, numbers: ChannelNumbers, d: ExchangeDecl) -> None:
    e = d.exchange
    if d.check_first or e.passive:
        ch = await conn.channel(numbers.take(), publisher_confirms=False)
        try:
            await ch.exchange_declare(e.name, passive=True)
            await _close(ch)
            return
        except REFUSED as exc:
            if e.passive or not isinstance(exc, aiormq.exceptions.ChannelNotFoundEntity):
                raise refused(d, str(exc)) from None
    ch = await conn.channel(numbers.take(), publisher_confirms=False)
    try:
        await ch.exchange_declare(
            e.name,
            exchange_type=e.type.value,
            durable=e.durable,
            auto_delete=e.auto_delete,
            arguments=dict(e.arguments) or None,
        )
    except REFUSED as exc:
        raise refused(d, str(exc)) from None
    await _close(ch)


async def _exists(conn: AbstractConnection, numbers: ChannelNumbers, name: str) -> bool:
    ch = await conn.channel(numbers.take(), publisher_confirms=False)
    try:
        await ch.queue_declare(name, passive=True)
    except aiormq.exceptions.ChannelNotFoundEntity:
        return False
    await _close(ch)
    return True


async def _declare(conn: AbstractConnection, numbers: ChannelNumbers, step: DeclareQueue) -> None:
    ch = await conn.channel(numbers.take(), publisher_confirms=False)
    try:
        await ch.queue_declare(step.name, durable=True, arguments=step.arguments or None)
    except aiormq.exceptions.ChannelPreconditionFailed as exc:
        raise refused(step, str(exc)) from None
    await _close(ch)


async def _close(ch: AbstractChannel) -> None:
    with contextlib.suppress(*CHANNEL_GONE, TimeoutError):
        await ch.close()
