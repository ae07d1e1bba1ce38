"""InMemoryBroker: a broker in the test process for fast tests of ackkit apps.

    from ackkit.testing import InMemoryBroker

    with InMemoryBroker() as broker:
        app = App(broker.url)                     # memory://<name>
        ...
        broker.publish_json("orders", {"id": 1})
        broker.wait_for("orders", ready=0, unacked=0)

An `App` or `AsyncApp` given its `memory://` URL runs exactly as on RabbitMQ:
the same core, consumers, executors and confirm publisher; only pika's and
aiormq's connections are replaced by stand-ins (`_mem_pika`, `_mem_aio`) over
the broker's state (`_mem_model`). The handle answers like the kit's real-broker
`BrokerHandle`: `counts`, `wait_for`, `connect()` (a pika-like blocking
connection), `purge`, `delete`, plus the helpers of `_helpers`.

Header types: a handler gets each header value as its runtime's client library hands
it over from RabbitMQ, because a message is kept as the bytes of its content header
and each stand-in decodes them with its client's own decoder: pika's for App
(`_mem_pikaio`), pamqp's for AsyncApp (`_mem_aio`). So a byte-array ('x') is `bytes`
on App and `bytearray` on AsyncApp; a long string ('S') is text when it is UTF-8,
`bytes` when not, on both; a decimal a `Decimal`, a timestamp a `datetime` (UTC),
tables and arrays a dict and a list of the same, on both. A publisher's headers are kept byte for
byte (`wire.Field`); the headers the broker writes itself (x-death, x-delivery-count,
x-acquired-count) are typed as RabbitMQ types them, in one place:
`_mem_state.broker_written`. tests/contract/test_header_types.py holds both brokers to it.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
from collections.abc import Callable, Iterator, Mapping
from types import SimpleNamespace
from typing import Any

from .._connection import inmemory
from ._errors import BrokerError, QueueNotFound
from ._handle import BrokerHandle
from ._mem_model import Model
from ._mem_rules import DEFAULT, rules_for
from ._mem_state import ChannelError, Clock, ManualClock
from ._queries import QueueCounts

__all__ = ["InMemoryBroker"]

VERSION = rules_for(DEFAULT).version
"""The RabbitMQ version whose rules an in-memory broker follows (and announces) unless
told otherwise: quorum queues count every return in x-delivery-count and have no
default delivery limit. ``InMemoryBroker(rabbitmq="4.0" | "4.3")`` follows those."""

_names = itertools.count(1)


class InMemoryBroker(BrokerHandle):
    """A RabbitMQ stand-in in this process: no network, no node, no Docker.

    ``ttl_scale`` multiplies every message TTL (a retry delay queue's too): ``0``
    hands retry copies back at once. ``manual_clock=True`` stops time for TTLs
    until :meth:`advance` moves it. ``rabbitmq`` picks the RabbitMQ version whose
    rules it follows and announces: "3.13" (the default), "4.0" or "4.3" (see
    ``_mem_rules``); an app on it picks its broker traits from that version. A policy
    (``set_policy``) applies at once, combined with each queue's own arguments as
    RabbitMQ combines them (max-length, max-length-bytes, overflow, message-ttl,
    dead-letter-exchange, dead-letter-routing-key, delivery-limit). What it
    does not model: see docs/guide/testing.md ("What the in-memory broker does not model").
    """

    kind = "memory"

    def __init__(
        self,
        *,
        name: str | None = None,
        ttl_scale: float = 1.0,
        manual_clock: bool = False,
        rabbitmq: str | None = None,
    ) -> None:
        if ttl_scale < 0:
            raise ValueError(f"ttl_scale must be >= 0, got {ttl_scale!r}")
        self.rules = rules_for(rabbitmq)
        name = name or f"broker-{os.getpid()}-{next(_names)}"
        super().__init__(f"memory://{name}", own=False, amqp_port=0, node_name=None)
        self.name = name
        self.clock: Clock = ManualClock(ttl_scale) if manual_clock else Clock(ttl_scale)
        self.model = Model(self.clock, self.rules)
        self._connections: list[Any] = []
        self._conn_lock = threading.Lock()
        self._timer: threading.Thread | None = None
        inmemory.register(name, self)
        if not manual_clock:
            self._timer = threading.Thread(
                target=self._expire_loop, name=f"ackkit-memory-{name}", daemon=True
            )
            self._timer.start()

    def __repr__(self) -> str:
        return f"<InMemoryBroker {self.url} (RabbitMQ {self.rules.version} rules)>"

    __str__ = __repr__

    # -- lifetime ---------------------------------------------------------------------

    def close(self) -> None:
        """Close every connection (as a broker shutting down would) and forget the broker."""
        if self.closed:
            return
        super().close()
        inmemory.unregister(self.name)
        self.close_connections("broker closed")
        with self.model.changed:
            self.model.changed.notify_all()

    def refusal(self) -> str | None:
        """Why a connection is refused now (the broker is closed), or None."""
        return "the in-memory broker is closed" if self.closed else None

    def connected(self, conn: Any) -> None:
        with self._conn_lock:
            self._connections.append(conn)

    def disconnected(self, conn: Any) -> None:
        with self._conn_lock:
            if conn in self._connections:
                self._connections.remove(conn)

    def connection_names(self) -> list[str]:
        """The connection name of every open connection (``connection_name`` of an app)."""
        with self._conn_lock:
            return [c.name for c in self._connections]

    def close_connections(self, reason: str = "closed by the ackkit test kit") -> None:
        """Force-close every open connection (CONNECTION_FORCED), as
        ``rabbitmqctl close_all_connections`` does: apps reconnect."""
        self.close_connections_named(None, reason)

    def close_connections_named(
        self, name: str | None, reason: str = "closed by the ackkit test kit"
    ) -> int:
        """Force-close the open connections named ``name`` (an app's ``connection_name``;
        None: all of them); returns how many."""
        with self._conn_lock:
            doomed = [c for c in self._connections if name is None or c.name == name]
        for c in doomed:
            c.force_close(reason)
        return len(doomed)

    # -- time ---------------------------------------------------------------------------

    def advance(self, seconds: float) -> None:
        """Move the manual clock (``manual_clock=True``) on; what expired is dead-lettered."""
        if not isinstance(self.clock, ManualClock):
            raise BrokerError("advance() needs InMemoryBroker(manual_clock=True)")
        self.clock.advance(seconds)
        self.model.expire_due()

    def _expire_loop(self) -> None:
        model = self.model
        with model.changed:
            while not self.closed:
                nxt = model.expire_due()
                wait = None if nxt is None else max(nxt - self.clock.now(), 0.0) + 0.001
                model.changed.wait(wait if wait is None else min(wait, 1.0))

    # -- the connection factories the runtimes use (through ackkit._connection.inmemory) ----

    def pika_parameters(self, name: str = "") -> Any:
        return SimpleNamespace(
            memory_broker=self,
            client_properties={"connection_name": name},
            frame_max=131072,
            credentials=SimpleNamespace(username="guest"),
            heartbeat=None,
        )

    def blocking_connection(self, params: Any = None) -> Any:
        from ._mem_blocking import BlockingConnection

        return BlockingConnection(self, params if params is not None else self.pika_parameters())

    def select_connection(self, params: Any, **callbacks: Any) -> Any:
        from ._mem_pika import SelectConnection

        return SelectConnection(self, params, **callbacks)

    def aio_connection(self, name: str) -> Any:
        from ._mem_aio import AioConnection

        if self.closed:
            from .._connection.io import ConnectFailed

            raise ConnectFailed("the in-memory broker is closed")
        return AioConnection(self, name)

    # -- BrokerHandle -------------------------------------------------------------------

    def connection_parameters(self, **overrides: Any) -> Any:
        return self.pika_parameters(str(overrides.get("client_properties", {}) or ""))

    def connect(self, **overrides: Any) -> Any:
        """A new pika-like ``BlockingConnection`` to this broker; the caller closes it."""
        return self.blocking_connection()

    def server_properties(self) -> dict[str, Any]:
        """What its connections announce: the RabbitMQ version whose rules it follows."""
        return {"product": "RabbitMQ (ackkit in-memory broker)", "version": self.rules.version}

    def server_version(self) -> str:
        return self.rules.version

    def ping(self, timeout: float = 5.0) -> bool:
        return not self.closed

    def counts(self, queue: str) -> QueueCounts:
        c = self.model.counts(queue)
        if c is None:
            raise QueueNotFound(f"queue {queue!r} does not exist (in-memory broker {self.name})")
        return QueueCounts(*c)

    @contextlib.contextmanager
    def _watch(self) -> Iterator[Callable[[float], object]]:
        """`wait_for` here is woken by every change of the broker (no polling delay)."""
        with self.model.changed:
            yield self.model.changed.wait

    def counts_all(self) -> dict[str, QueueCounts]:
        with self.model.lock:
            names = list(self.model.queues)
        out = {}
        for n in names:
            c = self.model.counts(n)
            if c is not None:
                out[n] = QueueCounts(*c)
        return out

    def exchange_names(self) -> list[str]:
        with self.model.lock:
            return sorted(self.model.exchanges)

    # -- policies ----------------------------------------------------------------------

    def _put_policy(
        self, name: str, pattern: str, definition: Mapping[str, Any], apply_to: str, priority: int
    ) -> None:
        """As on a real node: the queues whose names match ``pattern`` follow the policy
        (the model combines it with their own arguments)."""
        self.model.set_policy(name, pattern, dict(definition), apply_to, priority)

    def _drop_policy(self, name: str) -> None:
        try:
            self.model.clear_policy(name)
        except ChannelError as exc:
            raise BrokerError(f"{exc.text} (in-memory broker {self.name})") from None

    def _wait_policy(self, queue: str, name: str | None, timeout: float) -> None:
        """A policy applies at once here: ``wait_for`` has nothing to wait for."""

    def policy_of(self, queue: str) -> str | None:
        with self.model.lock:
            q = self.model.queues.get(queue)
            return None if q is None else q.policy_name

    def ctl(self, *args: str, timeout: float = 60.0) -> str:
        raise BrokerError(f"{self!r} has no node to run rabbitmqctl against")
