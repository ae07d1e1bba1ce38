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
from collections.abc import Iterable
from typing import Any

import aio_pika
import aiormq
import aiormq.exceptions
from aiormq.abc import AbstractChannel, AbstractConnection
from pamqp import commands as spec
from yarl import URL

from .._core.actions import Ack, Action, Nack, Reject, Republish
from .._core.errors import TopologyConflict
from .._core.listener import QueueSpec, missing_queue
from .._delivery import Delivery
from .._runtime_common import ConnectFailed, FatalConnectError, merge_headers
from .._tls import client_tls, handshake_hint, tls_failure
from .._url import mask_text, mask_url
from ._frames import SafeConnection

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
    """Channel numbers that are never reused on one connection.

    A frame queued for a channel that has just closed must never reach a new
    channel that got the same number: a stale delivery tag there closes the new
    channel with PRECONDITION_FAILED.
    """

    __slots__ = ("_next",)

    def __init__(self) -> None:
        self._next = 1

    def take(self) -> int:
        n = self._next
        self._next = n + 1 if n < 65535 else 1
        return n


def copy_properties(props: Any, set_headers: dict[str, Any]) -> spec.Basic.Properties:
    """A copy of aiormq/pamqp `props` with `set_headers` merged into its headers."""
    kw: dict[str, Any] = {f: getattr(props, f, None) for f in PROPERTY_FIELDS}
    kw.pop("cluster_id", None)
    kw["headers"] = merge_headers(kw.get("headers"), set_headers)
    return spec.Basic.Properties(**kw)


async def send_settles(ch: AbstractChannel, acts: Iterable[Action]) -> None:
    """basic.ack / nack / reject frames (no Republish) on `ch`, in order."""
    for a in acts:
        t = type(a)
        if t is Ack:
            await ch.basic_ack(a.tag, multiple=a.multiple, wait=False)  # type: ignore[union-attr]
        elif t is Nack:
            await ch.basic_nack(a.tag, multiple=a.multiple, requeue=a.requeue, wait=False)  # type: ignore[union-attr]
        elif t is Reject:
            await ch.basic_reject(a.tag, requeue=a.requeue, wait=False)  # type: ignore[union-attr]


async def publish_copy(
    ch: AbstractChannel, a: Republish, timeout: float = 30.0
) -> tuple[bool, bool]:
    """Publish the copy a Republish asks for on a confirm channel (declaring its queue
    first when asked). Returns (confirmed, unroutable): unroutable when it came back
    with basic.return, for `ListenerCore.republished(token, ok, unroutable=...)`."""
    d: Delivery = a.source
    try:
        if a.declare is not None:
            name, args = a.declare
            await ch.queue_declare(name, durable=True, arguments=args or None, timeout=timeout)
        conf = await ch.basic_publish(
            d.body,
            exchange=a.exchange,
            routing_key=a.routing_key,
            # minimal: the original's properties could not be read; the copy gets none
            properties=copy_properties(
                spec.Basic.Properties() if a.minimal else d.properties, a.set_headers
            ),
            mandatory=True,
            timeout=timeout,
        )
    except aiormq.exceptions.PublishError as exc:
        log.warning("republish to %r returned by the broker: %s", a.routing_key, exc)
        return False, True
    except (TimeoutError, *CHANNEL_GONE) as exc:
        log.warning("republish to %r failed: %s", a.routing_key, mask_text(repr(exc)))
        return False, False
    return isinstance(conf, spec.Basic.Ack), False


async def declare_queues(
    conn: AbstractConnection,
    numbers: ChannelNumbers,
    own: Iterable[QueueSpec],
    user: Iterable[tuple[str, dict[str, Any]]] = (),
    existing: Iterable[str] = (),
) -> None:
    """Check that the `existing` queues (listeners with declare=False) are there, then
    declare the user's queues (passively first when they have no arguments) and
    ackkit's own, each on a throwaway channel: a 406 costs that channel only and
    raises TopologyConflict, and so does a missing `existing` queue, before anything
    is declared."""
    for name in existing:
        if not await _exists(conn, numbers, name):
            raise TopologyConflict(missing_queue(name))
    for name, args in user:
        if not args and await _exists(conn, numbers, name):
            continue
        await _declare(conn, numbers, name, args, "listener queue")
    for q in own:
        await _declare(conn, numbers, q.name, q.arguments, q.purpose)


async def _exists(conn: AbstractConnection, numbers: ChannelNumbers, name: str) -> bool:
    ch = await conn.channel(numbers.take(), publisher_confirms=False)
    try:
        await ch.queue_declare(name, passive=True)
    except aiormq.exceptions.ChannelNotFoundEntity:
        return False
    await _close(ch)
    return True


async def _declare(
    conn: AbstractConnection,
    numbers: ChannelNumbers,
    name: str,
    args: dict[str, Any],
    what: str,
) -> None:
    ch = await conn.channel(numbers.take(), publisher_confirms=False)
    try:
        await ch.queue_declare(name, durable=True, arguments=args or None)
    except aiormq.exceptions.ChannelPreconditionFailed as exc:
        raise TopologyConflict(
            f"{what} {name!r} already exists with arguments that differ from {args!r}; "
            f"broker said: {exc}. Delete it or align its arguments."
        ) from None
    await _close(ch)


async def _close(ch: AbstractChannel) -> None:
    with contextlib.suppress(*CHANNEL_GONE, TimeoutError):
        await ch.close()
