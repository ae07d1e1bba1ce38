"""Pull mode: basic.get one message at a time, settled on the channel it came from."""

from __future__ import annotations

import logging
import ssl
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import pika
import pika.exceptions

from .._core import checks as C
from .._core.actions import Ack, Action, Nack, Reject, Republish
from .._core.brokers import traits_of
from .._core.errors import SettleNotAllowed
from .._core.listener import ListenerCore
from .._core.policy import DLQ_DEFAULT, AckMode, FlushPolicy, ListenerPolicy
from .._delivery import Delivery, DeliveryBase, Originals
from .._io import FatalConnectError
from .._publish import Outgoing, not_confirmed, publishes
from .._tls import TLS, client_tls, tls_failure
from .._url import check_url, mask_url
from . import _frames as frames
from ._pika import (
    blocking_connection,
    declare_queues,
    parameters,
)
from .publisher import BlockingCopies, carry

log = logging.getLogger("ackkit.pull")

SKIP_LIMIT = 10_000
"""Messages one get() call may settle itself (dead-letter) before it returns None."""
SKIP_SECONDS = 30.0
"""Seconds one get() call may spend settling such messages before it returns None."""
CLOSE_TIMEOUT = 10.0
"""Seconds close() waits for the broker's close-ok before it drops the connection."""


class _Deadline(Exception):
    """A wait on the blocking connection ran past its time (raised from pika's I/O loop)."""


@contextmanager
def _within(conn: Any, seconds: float) -> Iterator[None]:
    """Raise _Deadline out of whatever waits on pika blocking connection `conn` (a publish's
    confirm, a close-ok) once `seconds` have passed: a broker that blocked publishers (a
    memory or disk alarm) stops reading the connection, and pika would wait for ever."""
    ioloop = getattr(getattr(conn, "_impl", None), "ioloop", None)
    if ioloop is None:  # the in-memory broker never blocks
        yield
        return

    def expire() -> None:
        raise _Deadline

    handle = ioloop.call_later(max(seconds, 0.001), expire)
    try:
        yield
    finally:
        ioloop.remove_timeout(handle)


def _drop(conn: Any) -> None:
    """Drop a blocking connection without the closing handshake (the broker requeues what
    was delivered on it and not acked)."""
    impl = getattr(conn, "_impl", None)
    if impl is None or getattr(impl, "_transport", None) is None:
        return
    try:
        why = pika.exceptions.ConnectionClosedByClient(200, "dropped: the broker did not answer")
        impl._terminate_stream(why)
        conn.process_data_events(0)
    except Exception:  # it is gone either way
        log.debug("dropping the pull connection", exc_info=True)


class PullConnection:
    """A blocking connection for basic.get and publishing (tests, scripts, tools)."""

    def __init__(
        self, url: str, *, heartbeat: int = 30, tls: TLS | ssl.SSLContext | None = None
    ) -> None:
        self.url = check_url(url)
        C.integer("heartbeat", heartbeat, 0, C.MAX_SHORT)
        self._params = parameters(
            url, heartbeat=heartbeat, name="ackkit-pull", tls=client_tls(url, tls)
        )
        self._conn: Any = self._connect()
        self._ch: Any = None
        self._cores: dict[str, ListenerCore] = {}
        self._originals: dict[str, Originals[Delivery]] = {}  # per queue: tag -> Delivery
        self._lock = threading.RLock()
        self._closed = False
        self._copies = BlockingCopies()  # retry / dead-letter copies, confirmed

    def __repr__(self) -> str:
        return f"<PullConnection {mask_url(self.url)}>"

    def _connect(self) -> Any:
        try:
            return blocking_connection(self._params)
        except (pika.exceptions.AMQPConnectionError, ssl.SSLError) as exc:
            bad_tls = tls_failure(exc, self.url)
            if bad_tls is not None:
                raise FatalConnectError(bad_tls) from None
            raise

    @property
    def closed(self) -> bool:
        """close() was called (get, publish and settle refuse from then on)."""
        return self._closed

    def _check_open(self, what: str) -> None:
        if self._closed:
            raise RuntimeError(f"{what} on a closed PullConnection")

    def _note_lost_channel(self) -> None:
        """If the channel died, every delivery fetched on it is stale: tell the cores now,
        so a settle of one of them is dropped (the broker requeued it) and its tag is
        never sent on a successor channel."""
        if self._ch is None or not self._ch.is_open:
            for core in self._cores.values():
                if core.open:
                    core.channel_closed()

    @property
    def channel(self) -> Any:
        """The pika channel this connection gets and publishes on (opened, with
        publisher confirms, on first use; opened again after it closed)."""
        self._check_open("channel")
        if self._conn is None or not self._conn.is_open:
            self._conn = self._connect()
            self._ch = None
        if self._ch is None or not self._ch.is_open:
            self._ch = self._conn.channel()
            self._ch.confirm_delivery()
            for core in self._cores.values():
                core.channel_closed()
                core.channel_opened()
        return self._ch

    def _core(self, queue: str, dead_letter: str | None) -> ListenerCore:
        core = self._cores.get(queue)
        if core is None:
            policy = ListenerPolicy(
                name=f"pull:{queue}",
                queue=queue,
                mode=AckMode.MANUAL,
                prefetch=0,
                dead_letter=dead_letter,
                flush=FlushPolicy(max_pending=1, interval=0.0),
            )
            broker = traits_of(self._conn._impl.server_properties)
            core = ListenerCore(policy, shared_channel=True, broker=broker)  # one channel
            self.channel  # noqa: B018 - open the channel first
            core.channel_opened()
            declare_queues(self._conn, core.topology())
            self._cores[queue] = core
            self._originals[queue] = Originals()
        return core

    def get(
        self,
        queue: str,
        *,
        dead_letter: str | None = DLQ_DEFAULT,
        max_skip: int = SKIP_LIMIT,
        max_seconds: float = SKIP_SECONDS,
    ) -> Delivery | None:
        """basic.get with manual ack: a Delivery to settle, or None when the queue is empty.

        A message that must not reach the caller (a garbage attempt header, ...) is
        dead-lettered here and the next one fetched. One call settles at most
        `max_skip` such messages and spends at most about `max_seconds` on them;
        past either bound it returns None although the queue may hold more (call
        get() again).
        """
        deadline = time.monotonic() + max_seconds
        with self._lock:
            self._check_open("get()")
            core = self._core(queue, dead_letter)
            skipped = 0
            while True:
                ch = self.channel
                method, props, body = ch.basic_get(queue, auto_ack=False)
                if method is None:
                    return None
                exchange, rk = frames.text(method.exchange), frames.text(method.routing_key)
                why = frames.unreadable(method, props)  # dead-lettered by the core's verdict
                t = core.receive(
                    method.delivery_tag,
                    method.redelivered,
                    None if why else props.headers,
                    exchange,
                    rk,
                    unreadable=why,
                    wire_headers=getattr(props, "wire_headers", None),
                )
                d = Delivery(
                    body,
                    props,
                    t,
                    self,
                    exchange=exchange,
                    routing_key=rk,
                    redelivered=method.redelivered,
                    queue=queue,
                )
                self._originals[queue].put(t.generation, t.tag, d)
                if t.verdict is None:
                    return d
                self._execute(core, ch, t.verdict)
                skipped += 1
                if skipped >= max_skip or time.monotonic() >= deadline:
                    log.warning(
                        "get(%r): settled %d message(s) without handing one over; "
                        "returning None, the queue may hold more",
                        queue,
                        skipped,
                    )
                    return None

    def _settle(self, delivery: DeliveryBase, kind: str, requeue: bool, multiple: bool) -> None:
        with self._lock:
            if self._closed and not delivery._tracked.settled:
                raise SettleNotAllowed(
                    f"cannot {kind} delivery tag {delivery.delivery_tag}: its PullConnection "
                    "is closed (the broker requeued the message when its channel closed)"
                )
            core = self._cores[delivery.queue]
            self._note_lost_channel()
            stale = not core.current(delivery._tracked.generation)
            acts = core.settle(delivery._tracked, kind, requeue=requeue, multiple=multiple)
            self._execute(core, self._ch, acts)
            if stale:
                log.warning(
                    "%s of delivery tag %d not sent: its channel closed and the broker requeued it",
                    kind,
                    delivery.delivery_tag,
                )

    def _execute(self, core: ListenerCore, ch: Any, acts: list[Action]) -> None:
        gen = core.generation
        originals = self._originals[core.policy.queue]
        originals.decided(gen, acts)
        for a in acts:
            if ch is not self._ch or ch is None or not ch.is_open or not core.current(gen):
                return  # tags of a closed channel are worthless: never sent elsewhere
            if isinstance(a, (Ack, Nack, Reject)):
                if isinstance(a, Ack):
                    ch.basic_ack(a.tag, a.multiple)
                elif isinstance(a, Nack):
                    ch.basic_nack(a.tag, a.multiple, a.requeue)
                else:
                    ch.basic_reject(a.tag, a.requeue)
                originals.settled(gen, a)
            elif isinstance(a, Republish):  # on a confirm channel of its own, as the App's
                d = originals.copy(a.token)
                if d is None:
                    continue  # not a delivery of this channel's
                again = self._copies.copy(self._conn, core, a, d.properties, d.body)
                self._execute(core, ch, again)
                originals.answered(a.token)

    @publishes
    def publish(self, msg: Outgoing) -> None:
        """Publish a message and wait for the broker's confirm."""
        self.publish_message(msg)

    def publish_message(self, msg: Outgoing) -> None:
        """MessagePublisher protocol: carry a built message, confirmed."""
        with self._lock:
            self._check_open("publish()")
            ch = self.channel
            try:
                with _within(self._conn, msg.timeout):
                    carry(ch, msg)
            except _Deadline:
                # The channel has a publish in flight whose answer may never come: the
                # connection is dropped (deliveries fetched on it go back to their
                # queues), the next call connects again.
                self._abandon()
                raise not_confirmed(
                    msg,
                    f"no confirm within {msg.timeout:g} s (is the broker blocking publishers? "
                    "a memory or disk alarm); the connection was dropped",
                ) from None

    def _abandon(self) -> None:
        conn, self._conn, self._ch = self._conn, None, None
        for core in self._cores.values():
            if core.open:
                core.channel_closed()
        _drop(conn)

    def declare_queue(self, name: str, arguments: Mapping[str, Any] | None = None) -> None:
        """Declare a durable queue (with x-arguments), e.g. before the first `get()`."""
        with self._lock:
            self.channel.queue_declare(name, durable=True, arguments=dict(arguments or {}) or None)

    def close(self) -> None:
        """Close the channel, then the connection (a second call does nothing).

        The channel is closed with a round trip first: the broker handles a
        channel's frames in order, so once it answered Channel.CloseOk every ack,
        nack and reject sent before has been carried out. Deliveries not settled
        by then go back to their queue.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for core in self._cores.values():
                if core.open:
                    core.channel_closed()
            ch, conn, self._ch, self._conn = self._ch, self._conn, None, None
            if conn is None:
                return
            try:
                with _within(conn, CLOSE_TIMEOUT):
                    try:
                        if ch is not None and ch.is_open:
                            ch.close()
                    except pika.exceptions.AMQPError as exc:
                        log.warning("closing the pull channel: %r", exc)
                    if conn.is_open:
                        conn.close()
            except _Deadline:
                log.warning(
                    "closing the pull connection: no answer within %g s (is the broker "
                    "blocking publishers?); dropped it",
                    CLOSE_TIMEOUT,
                )
                _drop(conn)
            except pika.exceptions.AMQPError as exc:
                log.warning("closing the pull connection: %r", exc)


@contextmanager
def connect(
    url: str = "amqp://guest:guest@127.0.0.1:5672/%2f", **kw: Any
) -> Iterator[PullConnection]:
    """`with ackkit.connect(url) as conn: d = conn.get("q")` - pull mode."""
    conn = PullConnection(url, **kw)
    try:
        yield conn
    finally:
        conn.close()
