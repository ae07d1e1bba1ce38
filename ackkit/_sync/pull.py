"""Pull mode: basic.get one message at a time, settled on the channel it came from."""

from __future__ import annotations

import logging
import ssl
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import pika
import pika.exceptions

from .._core.actions import Ack, Action, Nack, Reject, Republish
from .._core.listener import ListenerCore
from .._core.policy import DLQ_DEFAULT, AckMode, FlushPolicy, ListenerPolicy
from .._delivery import Delivery
from .._runtime_common import FatalConnectError, publish_properties
from .._tls import TLS, client_tls, tls_failure
from .._url import mask_url
from ._pika import blocking_connection, copy_options, copy_properties, declare_queues, parameters

log = logging.getLogger("ackkit")


class PullConnection:
    """A blocking connection for basic.get and publishing (tests, scripts, tools)."""

    def __init__(
        self, url: str, *, heartbeat: int = 30, tls: TLS | ssl.SSLContext | None = None
    ) -> None:
        self.url = url
        self._params = parameters(
            url, heartbeat=heartbeat, name="ackkit-pull", tls=client_tls(url, tls)
        )
        self._conn: Any = self._connect()
        self._ch: Any = None
        self._cores: dict[str, ListenerCore] = {}
        self._lock = threading.RLock()

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
    def channel(self) -> Any:
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
            core = ListenerCore(policy)
            self.channel  # noqa: B018 - open the channel first
            core.channel_opened()
            declare_queues(self._conn, core.topology())
            self._cores[queue] = core
        return core

    def get(self, queue: str, *, dead_letter: str | None = DLQ_DEFAULT) -> Delivery | None:
        """basic.get with manual ack: a Delivery to settle, or None when the queue is empty."""
        with self._lock:
            core = self._core(queue, dead_letter)
            ch = self.channel
            method, props, body = ch.basic_get(queue, auto_ack=False)
            if method is None:
                return None
            t = core.receive(
                method.delivery_tag,
                method.redelivered,
                props.headers,
                method.exchange,
                method.routing_key,
            )
            d = Delivery(
                body,
                props,
                t,
                self,
                exchange=method.exchange,
                routing_key=method.routing_key,
                redelivered=method.redelivered,
                queue=queue,
            )
            if t.verdict is not None:
                self._execute(core, t.verdict)
                return self.get(queue, dead_letter=dead_letter)
            return d

    def settle(self, delivery: Delivery, kind: str, requeue: bool, multiple: bool) -> None:
        with self._lock:
            core = self._cores[delivery.queue]
            acts = core.settle(delivery.tracked, kind, requeue=requeue, multiple=multiple)
            self._execute(core, acts)

    def _execute(self, core: ListenerCore, acts: list[Action]) -> None:
        ch = self._ch
        if ch is None or not ch.is_open:
            return
        for a in acts:
            if isinstance(a, Ack):
                ch.basic_ack(a.tag, a.multiple)
            elif isinstance(a, Nack):
                ch.basic_nack(a.tag, a.multiple, a.requeue)
            elif isinstance(a, Reject):
                ch.basic_reject(a.tag, a.requeue)
            elif isinstance(a, Republish):
                d: Delivery = a.source
                ok, unroutable = True, False
                if a.declare is not None:
                    name, args = a.declare
                    ch.queue_declare(name, durable=True, arguments=args or None)
                error: str | None = None
                try:
                    props = copy_properties(
                        None if a.minimal else d.properties,
                        a.set_headers,
                        **copy_options(a, ch._impl),
                    )
                    ch.basic_publish(a.exchange, a.routing_key, d.body, props, mandatory=True)
                except pika.exceptions.UnroutableError:
                    ok, unroutable = False, True
                except pika.exceptions.NackError:
                    ok = False
                except (pika.exceptions.AMQPError, ValueError, TypeError) as exc:
                    if not ch.is_open:
                        raise
                    ok, error = False, f"{a.purpose} copy not publishable: {exc!r:.300}"
                    log.error("%s", error)
                again = core.republished(a.token, ok, unroutable=unroutable, error=error)
                self._execute(core, again)

    def publish(
        self,
        routing_key: str,
        body: bytes | str,
        *,
        exchange: str = "",
        headers: Mapping[str, Any] | None = None,
        message_id: str | None = None,
        content_type: str | None = "application/json",
        persistent: bool = True,
        **props: Any,
    ) -> None:
        """Publish with publisher confirms (raises if the broker refuses or cannot route)."""
        if isinstance(body, str):
            body = body.encode()
        p = pika.BasicProperties(
            **publish_properties(headers, message_id, content_type, persistent, props)
        )
        with self._lock:
            self.channel.basic_publish(exchange, routing_key, body, p, mandatory=True)

    def declare_queue(self, name: str, arguments: Mapping[str, Any] | None = None) -> None:
        with self._lock:
            self.channel.queue_declare(name, durable=True, arguments=dict(arguments or {}) or None)

    def close(self) -> None:
        with self._lock:
            if self._conn is not None and self._conn.is_open:
                self._conn.close()
            self._conn = None


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
