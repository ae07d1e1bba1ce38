"""Pull mode: basic.get one message at a time, settled on the channel it came from.

Pull is a listener with prefetch 0: each queue gets a MANUAL `ListenerCore`, and
what it decides for a pulled message (a settle, a dead-letter copy and the ack
after its confirm) is carried out by the App's `Executor` (`_Queue`), its copies
published by the confirm publisher's rules on a blocking connection
(`BlockingCopies`). There is no I/O thread: every call carries out what it
decided before it returns.
"""

from __future__ import annotations

import logging
import ssl
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import pika
import pika.exceptions

from .._connection.io import FatalConnectError
from .._connection.tls import tls_failure
from .._connection.url import mask_text
from .._core.actions import Republish
from .._core.listener import ListenerCore
from .._core.policy import DLQ_DEFAULT
from .._core.step import Step
from .._interpreter.pulling import SKIP_LIMIT, SKIP_SECONDS, PullBase, Skips
from .._messages.delivery import Delivery, DeliveryBase
from .._messages.publish import Outgoing, not_confirmed, publishes
from . import _frames as frames
from ._pika import (
    blocking_connection,
    parameters,
)
from .executor import Executor
from .publisher import BlockingCopies, carry

log = logging.getLogger("ackkit.pull")

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


_REFUSED = (
    pika.exceptions.ProbableAuthenticationError,
    pika.exceptions.ProbableAccessDeniedError,
)
"""Connect errors no other node address would fix (same credentials, same vhost)."""


class PullConnection(PullBase["_Queue"]):
    """A blocking connection for basic.get and publishing (tests, scripts, tools)."""

    def _setup_client(self) -> None:
        """Connect now (to the first node that takes a connection)."""
        self._params = {
            u: parameters(u, heartbeat=self.heartbeat, name="ackkit-pull", tls=self._tls[u])
            for u in self.urls
        }
        self._conn: Any = self._connect()
        self._ch: Any = None
        self._lock = threading.RLock()
        self._copies = BlockingCopies()  # retry / dead-letter copies, confirmed

    def _connect(self, lost: bool = False) -> Any:
        """A connection to the first node address that takes one, starting at the
        current one (after a `lost` connection, the next one), once around."""
        for url, last in self._nodes(lost):
            try:
                return blocking_connection(self._params[url])
            except (pika.exceptions.AMQPConnectionError, ssl.SSLError) as exc:
                bad_tls = tls_failure(exc, url)
                if bad_tls is not None:
                    raise FatalConnectError(bad_tls) from None
                if last or isinstance(exc, _REFUSED):
                    raise
                self._failed(url, mask_text(repr(exc)))
        raise AssertionError("unreachable")  # pragma: no cover

    @property
    def channel(self) -> Any:
        """The pika channel this connection gets and publishes on (opened, with
        publisher confirms, on first use; opened again after it closed)."""
        self._check_open("channel")
        if self._conn is None or not self._conn.is_open:
            self._conn = self._connect(lost=self._conn is not None)
            self._ch = None
        if self._ch is None or not self._ch.is_open:
            self._ch = self._conn.channel()
            self._ch.confirm_delivery()
            self._channel_replaced(self._ch)
        return self._ch

    def _queue(self, queue: str, dead_letter: str | None) -> _Queue:
        q = self._queues.get(queue)
        if q is None:
            core = self._new_core(queue, dead_letter, self._conn._impl.server_properties)
            q = self._keep(queue, _Queue(self, core), self.channel)  # opened first
        return q

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

        get() declares nothing: the queue's dead-letter queue (`dead_letter`, by default
        `<queue>.dlq`) is declared with the first dead letter sent to it.
        """
        skips = Skips(queue, max_skip, max_seconds)
        with self._lock:
            self._check_open("get()")
            q = self._queue(queue, dead_letter)
            core = q.core
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
                with q.lock:
                    q.originals.put(t.generation, t.tag, d)
                    if t.verdict is None:
                        return d
                    q.queue(Step(t.generation, t.verdict))
                q.flush()
                if skips.one_more():
                    return None

    def _settle(self, delivery: DeliveryBase, kind: str, requeue: bool, multiple: bool) -> None:
        with self._lock:
            q = self._settling(delivery, kind, self._ch is not None and self._ch.is_open)
            t = delivery._tracked
            with q.lock:
                acts = q.core.settle(t, kind, requeue=requeue, multiple=multiple)
                if acts.actions:  # decided for its own channel: a stale delivery gets none
                    q.queue(acts)
            q.flush()
            self._settled(q, delivery, kind, acts)

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
        self._channel_gone()
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
            self._channel_gone()
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
    url: str | Sequence[str] = "amqp://guest:guest@127.0.0.1:5672/%2f", **kw: Any
) -> Iterator[PullConnection]:
    """`with ackkit.connect(url) as conn: d = conn.get("q")` - pull mode."""
    conn = PullConnection(url, **kw)
    try:
        yield conn
    finally:
        conn.close()


class _Queue(Executor):
    """One queue's pulled deliveries: its core's actions carried out by the App's
    executor on the pull channel, its copies by `BlockingCopies`. The executor's I/O
    thread is the caller's: the pull connection's lock is held, and `decide` / `flush`
    carry everything out before the call returns."""

    def __init__(self, pull: PullConnection, core: ListenerCore) -> None:
        super().__init__(core.policy.name, core, self, log)
        self.pull = pull

    @property
    def connection(self) -> Any:
        """IoThread: the pull's blocking connection."""
        return self.pull._conn

    def call_soon(self, fn: Any, /) -> object:
        """IoThread: never needed (nothing is `send()`-queued for a later flush)."""
        raise NotImplementedError("pull mode carries out its actions in the caller's call")

    def _publish(self, gen: int, a: Republish) -> None:
        self.pull._copies.publish(self, gen, a)

    def _fence(self, ch: Any, rest: Step) -> None:
        """A blocking basic.qos round trip (a pull core holds no copies: never asked)."""
        ch.basic_qos(prefetch_count=0)
        self.execute(rest)
