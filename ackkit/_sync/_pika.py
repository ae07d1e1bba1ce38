"""Small pika helpers shared by the App, pull mode and the tools."""

from __future__ import annotations

import logging
import ssl
import weakref
from collections.abc import Callable, Iterable, Mapping
from functools import partial
from typing import Any

import pika
import pika.exceptions
import pika.frame

from .._connection.inmemory import broker_for
from .._connection.tls import client_tls
from .._core import wire
from .._core.exchanges import BindingDecl, DeclareQueue, ExchangeDecl, Plan
from .._core.listener import QueueSpec
from .._interpreter import copying
from .._interpreter.preparing import NO_EXCHANGES, Declaration, Exists, declarations, refused
from .._telemetry.logs import log_blocked
from ._frames import SafeSelectConnection

# pika logs every failed connection attempt at ERROR on these loggers, with a traceback
# (about ten lines an attempt; a refused login three more); ackkit logs the cause itself,
# in one line, and retries or fails. Their lines are kept when pika's logger is at DEBUG
# (`ackkit run --log-level DEBUG`, or your own logging config).
CONNECT_CHATTER = (
    "pika.connection",
    "pika.adapters.utils.connection_workflow",
    "pika.adapters.utils.io_services_utils",
    "pika.adapters.blocking_connection",
)


def _connect_chatter(record: logging.LogRecord) -> bool:
    return record.levelno >= logging.CRITICAL or logging.getLogger("pika").isEnabledFor(
        logging.DEBUG
    )


for _name in CONNECT_CHATTER:
    logging.getLogger(_name).addFilter(_connect_chatter)

PROPERTY_FIELDS = tuple(n for n in wire.PROPERTY_NAMES if n != "cluster_id")
"""The basic properties pika reads and writes (cluster_id is deprecated and left out)."""


class Amqp10Parameters(pika.URLParameters):  # type: ignore[misc]
    """pika's parameters for a URL, marked for an AMQP 1.0 connection (`select_connection`
    opens `ackkit._amqp10.connection.Connection` with them; a blocking connection, the
    topology's, is still AMQP 0-9-1)."""

    amqp10 = True


def parameters(
    url: str,
    *,
    heartbeat: int | None = None,
    name: str = "ackkit",
    tls: tuple[ssl.SSLContext, str | None] | None = None,
    amqp10: bool = False,
) -> Any:
    """pika parameters for `url`; amqps:// with `tls` (from `client_tls`) or, when it is
    None, certificates verified against the system's trust store. `amqp10`: the
    consuming connection speaks AMQP 1.0 (`Amqp10Parameters`)."""
    memory = broker_for(url)
    if memory is not None:  # ackkit.testing.InMemoryBroker
        return memory.pika_parameters(name)
    params = Amqp10Parameters(url) if amqp10 else pika.URLParameters(url)
    tls = tls or client_tls(url, None)
    if tls is not None:
        params.ssl_options = pika.SSLOptions(tls[0], tls[1])
    if heartbeat is not None:
        params.heartbeat = heartbeat
    props = dict(params.client_properties or {})
    props.setdefault("connection_name", name)
    params.client_properties = props
    return params


class WireProperties(pika.BasicProperties):  # type: ignore[misc]
    """Basic properties that pika sends as ackkit's encoder wrote them (`wire`): pika
    cannot encode a float header, and decodes float and double ones as ints."""

    def __init__(self, props: Mapping[str, Any], encoded: bytes | None = None) -> None:
        """`encoded`: what `wire.encode_properties(props)` gives, when already known."""
        super().__init__(headers=props.get("headers"))
        self.wire = wire.encode_properties(props) if encoded is None else encoded
        self.mapping = props

    def encode(self) -> list[bytes]:
        return [self.wire]


FaithfulConnection = SafeSelectConnection
"""The SelectConnection of every ackkit connection (see SafeSelectConnection): unreadable
headers salvaged, readable ones kept as they were on the wire for byte-exact copies."""


def blocking_connection(params: Any) -> pika.BlockingConnection:
    """A BlockingConnection whose deliveries keep their raw headers (FaithfulConnection)."""
    memory = getattr(params, "memory_broker", None)
    if memory is not None:
        return memory.blocking_connection(params)
    return pika.BlockingConnection(params, _impl_class=FaithfulConnection)


def select_connection(params: Any, **callbacks: Any) -> Any:
    """A FaithfulConnection (or an in-memory broker's stand-in) with pika's callbacks."""
    memory = getattr(params, "memory_broker", None)
    if memory is not None:
        return memory.select_connection(params, **callbacks)
    if getattr(params, "amqp10", False):  # App(protocol="amqp1.0")
        from .._amqp10.connection import Connection

        return Connection(params, **callbacks)
    conn = FaithfulConnection(params, **callbacks)
    name = str((params.client_properties or {}).get("connection_name", ""))
    conn.add_on_connection_blocked_callback(
        lambda _c, frame: log_blocked(name, str(frame.method.reason))
    )
    conn.add_on_connection_unblocked_callback(lambda _c, _f: log_blocked(name, None))
    return conn


def property_map(props: Any) -> dict[str, Any]:
    """AMQP property name -> value of a pika BasicProperties (raw headers when kept)."""
    if props is None:
        return {}
    kw = {f: getattr(props, f, None) for f in PROPERTY_FIELDS}
    raw = getattr(props, "wire_headers", None)
    if raw is not None:
        kw["headers"] = raw
    return kw


def read_headers(props: Any) -> dict[str, Any]:
    """The headers of pika properties with their float and double values as floats: pika
    reads those as ints (2.5 as 2); the wire bytes a FaithfulConnection keeps say which
    they were and hold their value (wire.exact_floats). The other values are pika's."""
    headers = dict(getattr(props, "headers", None) or {})
    raw = getattr(props, "wire_headers", None)
    return wire.exact_floats(headers, raw) if raw else headers


def measure(props: Mapping[str, Any]) -> bytes:
    """What pika sends for a copy with `props` (the encoder copies fit to frame_max):
    `WireProperties` sends these bytes as they are."""
    return wire.encode_properties(props)


def copy_options(a: Any, ch: Any) -> dict[str, Any]:
    """copy_properties keywords for Republish `a` published on pika channel `ch`."""
    params = getattr(getattr(ch, "connection", None), "params", None)
    creds = getattr(params, "credentials", None)
    return copying.copy_options(
        a, getattr(params, "frame_max", 0), getattr(creds, "username", None)
    )


copy_properties = copying.CopyProperties(property_map, measure, WireProperties)
"""`copy_properties(props, set_headers, *, purpose, minimal, frame_max, user)`: the
properties of a copy of a delivery with `props` (any object with the AMQP property
attributes): what `ackkit._core.copies` decides, ready for pika."""


def declare_queues(
    conn: pika.BlockingConnection,
    own: Iterable[QueueSpec],
    user: Iterable[tuple[str, dict[str, Any]]] = (),
    existing: Iterable[str] = (),
    exchanges: Plan = NO_EXCHANGES,
) -> None:
    """Carry out `preparation(...)` (`ackkit._core.exchanges`): the `existing` queues
    checked, then the exchanges, the listeners' queues, ackkit's own, the bindings,
    idempotently, each on a throwaway channel; a refusal is a TopologyConflict."""
    for step in declarations(own, user, existing, exchanges):
        if isinstance(step, Exists):
            step.exists = _exists(conn, step.name)
        elif isinstance(step, ExchangeDecl):
            _on_channel(conn, step, partial(_exchange, conn=conn, d=step))
        elif isinstance(step, DeclareQueue):
            _declare(conn, step)
        else:
            _on_channel(conn, step, partial(_bind, b=step))


def _bind(ch: Any, b: BindingDecl) -> None:
    ch.queue_bind(b.queue, b.exchange, b.routing_key, arguments=dict(b.arguments) or None)


def _on_channel(conn: Any, step: Declaration, op: Callable[[Any], object]) -> None:
    """Run `op` for `step` on a throwaway channel; a refusal (406, 403, 404) is a
    TopologyConflict."""
    ch = conn.channel()
    try:
        op(ch)
    except pika.exceptions.ChannelClosedByBroker as exc:
        if exc.reply_code in (403, 404, 406):
            raise refused(step, exc.reply_text) from None
        raise
    if ch.is_open:
        ch.close()


def _exchange(ch: Any, *, conn: Any, d: ExchangeDecl) -> None:
    e = d.exchange
    if d.check_first or e.passive:
        probe = conn.channel()
        try:
            probe.exchange_declare(e.name, passive=True)
            probe.close()
            return
        except pika.exceptions.ChannelClosedByBroker as exc:
            if exc.reply_code != 404 or e.passive:
                raise refused(d, exc.reply_text) from None
    ch.exchange_declare(
        e.name,
        e.type.value,
        durable=e.durable,
        auto_delete=e.auto_delete,
        arguments=dict(e.arguments) or None,
    )


_PROBES: weakref.WeakSet[Any] = weakref.WeakSet()
"""pika channels (their `_impl`) that are asking whether a queue exists, right now."""
_CONSUMING: weakref.WeakSet[Any] = weakref.WeakSet()
"""pika channels waiting for the answer to a listener's basic.consume: ackkit logs a
refusal itself, once (`ackkit._core.consume`)."""
REFUSALS = (403, 404, 405, 406)


class _QuietProbes(logging.Filter):
    """Drops pika's WARNING "Received remote Channel.Close (404)" for a channel that only
    asked whether a queue exists (`passive_declare`): there NOT_FOUND is the answer, not
    a problem; and for a listener's channel whose basic.consume was refused (ackkit logs
    that itself, once: a standby tries again every few seconds). Every other channel
    close, of any channel, is still logged."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if not (isinstance(args, tuple) and len(args) == 3):
            return True
        code, ch = args[0], args[2]
        if code == 404 and ch in _PROBES:
            return False
        return not (code in REFUSALS and ch in _CONSUMING)


logging.getLogger("pika.channel").addFilter(_QuietProbes())


def drop(conn: Any) -> None:
    """End a (select) connection that did not answer its close: the stream is cut, the
    connection's close callbacks run (the broker requeues what was not acked)."""
    if getattr(conn, "is_closed", True) or not hasattr(conn, "_terminate_stream"):
        return
    logging.getLogger("ackkit").warning(
        "ackkit: the broker did not answer the connection close (is it blocking "
        "publishers? a memory or disk alarm); dropped the connection"
    )
    try:
        conn._terminate_stream(
            pika.exceptions.ConnectionClosedByClient(200, "dropped: no close-ok in time")
        )
    except Exception:  # it is going either way
        logging.getLogger("ackkit").debug("dropping the connection", exc_info=True)


def quiet_refusals(ch: Any, on: bool) -> None:
    """While `on`, pika's warning about a refused basic.consume on the (select connection)
    channel `ch` is left out of the log; ackkit logs its own line."""
    if on:
        _CONSUMING.add(ch)
    else:
        _CONSUMING.discard(ch)


def passive_declare(ch: Any, name: str) -> Any | None:
    """queue.declare(passive) on the blocking channel `ch`: its Declare-Ok frame, or None
    when the queue does not exist (the broker then closes `ch`; pika's warning about
    that is left out of the log)."""
    impl = getattr(ch, "_impl", None)
    if impl is not None:
        _PROBES.add(impl)
    try:
        return ch.queue_declare(name, passive=True)
    except pika.exceptions.ChannelClosedByBroker as exc:
        if exc.reply_code == 404:
            logging.getLogger("ackkit").debug("queue %r does not exist (yet)", name)
            return None
        raise
    finally:
        if impl is not None:
            _PROBES.discard(impl)


def _exists(conn: pika.BlockingConnection, name: str) -> bool:
    ch = conn.channel()
    if passive_declare(ch, name) is None:
        return False
    ch.close()
    return True


def _declare(conn: pika.BlockingConnection, step: DeclareQueue) -> None:
    ch = conn.channel()
    try:
        ch.queue_declare(step.name, durable=True, arguments=step.arguments or None)
    except pika.exceptions.ChannelClosedByBroker as exc:
        if exc.reply_code == 406:
            raise refused(step, exc.reply_text) from None
        raise
    ch.close()
