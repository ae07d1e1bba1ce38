"""Small pika helpers shared by the App, pull mode and the tools."""

from __future__ import annotations

import ssl
from collections.abc import Iterable, Mapping
from typing import Any

import pika
import pika.exceptions

from .._core.errors import TopologyConflict
from .._core.listener import QueueSpec, missing_queue
from .._runtime_common import merge_headers
from .._tls import client_tls

PROPERTY_FIELDS = (
    "content_type",
    "content_encoding",
    "headers",
    "delivery_mode",
    "priority",
    "correlation_id",
    "reply_to",
    "expiration",
    "message_id",
    "timestamp",
    "type",
    "user_id",
    "app_id",
)


def parameters(
    url: str,
    *,
    heartbeat: int | None = None,
    name: str = "ackkit",
    tls: tuple[ssl.SSLContext, str | None] | None = None,
) -> Any:
    """pika parameters for `url`; amqps:// with `tls` (from `client_tls`) or, when it is
    None, certificates verified against the system's trust store."""
    params = pika.URLParameters(url)
    tls = tls or client_tls(url, None)
    if tls is not None:
        params.ssl_options = pika.SSLOptions(tls[0], tls[1])
    if heartbeat is not None:
        params.heartbeat = heartbeat
    props = dict(params.client_properties or {})
    props.setdefault("connection_name", name)
    params.client_properties = props
    return params


def copy_properties(props: Any, set_headers: Mapping[str, Any]) -> pika.BasicProperties:
    """A copy of `props` (any object with the AMQP property attributes) with headers merged."""
    kw = {f: getattr(props, f, None) for f in PROPERTY_FIELDS}
    kw["headers"] = merge_headers(kw.get("headers"), set_headers)
    mode = kw.get("delivery_mode")
    if mode is not None and hasattr(mode, "value"):
        kw["delivery_mode"] = mode.value
    ts = kw.get("timestamp")
    if ts is not None and not isinstance(ts, int):
        kw["timestamp"] = int(ts.timestamp()) if hasattr(ts, "timestamp") else None
    return pika.BasicProperties(**kw)


def declare_queues(
    conn: pika.BlockingConnection,
    own: Iterable[QueueSpec],
    user: Iterable[tuple[str, dict[str, Any]]] = (),
    existing: Iterable[str] = (),
) -> None:
    """Check that the `existing` queues (listeners with declare=False) are there, then
    declare the user's queues (passively first) and ackkit's own queues, idempotently.

    A missing `existing` queue raises TopologyConflict before anything is declared; so
    does a queue that exists with conflicting arguments (the failed declare only costs a
    throwaway channel).
    """
    for name in existing:
        if not _exists(conn, name):
            raise TopologyConflict(missing_queue(name))
    for name, args in user:
        if not args and _exists(conn, name):
            continue
        _declare(conn, name, args, "listener queue")
    for spec in own:
        _declare(conn, spec.name, spec.arguments, spec.purpose)


def _exists(conn: pika.BlockingConnection, name: str) -> bool:
    ch = conn.channel()
    try:
        ch.queue_declare(name, passive=True)
    except pika.exceptions.ChannelClosedByBroker as exc:
        if exc.reply_code == 404:
            return False
        raise
    ch.close()
    return True


def _declare(conn: pika.BlockingConnection, name: str, args: dict[str, Any], what: str) -> None:
    ch = conn.channel()
    try:
        ch.queue_declare(name, durable=True, arguments=args or None)
    except pika.exceptions.ChannelClosedByBroker as exc:
        if exc.reply_code == 406:
            raise TopologyConflict(
                f"{what} {name!r} already exists with arguments that differ from {args!r}; "
                f"broker said: {exc.reply_text}. Delete it or align its arguments."
            ) from None
        raise
    ch.close()
