"""What pull mode's connections share, whichever client carries them out.

`PullConnection` (pika, blocking) and `AsyncPullConnection` (aio-pika, asyncio) differ
in how they talk to the broker and nothing else: both check the same arguments, try
the node addresses in the same order, keep one MANUAL `ListenerCore` per queue, mark
every delivery stale when their channel goes, refuse work once closed, and stop one
`get()` after the same number of messages it settled itself. `PullBase` holds that
bookkeeping; a runtime's class adds the client calls (connect, basic.get, settle,
publish, close).
"""

from __future__ import annotations

import logging
import ssl
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Generic, Protocol, TypeVar

from .._connection import addresses
from .._connection.tls import TLS, client_tls
from .._connection.url import check_url, mask_url
from .._core import checks as C
from .._core.actions import Action
from .._core.brokers import traits_of
from .._core.errors import SettleNotAllowed
from .._core.listener import ListenerCore
from .._core.policy import ListenerPolicy
from .._messages.delivery import DeliveryBase

log = logging.getLogger("ackkit.pull")

SKIP_LIMIT = 10_000
"""Messages one get() call may settle itself (dead-letter) before it returns None."""
SKIP_SECONDS = 30.0
"""Seconds one get() call may spend settling such messages before it returns None."""


class PulledQueue(Protocol):
    """One queue of a pull connection, as a runtime builds it: its core, and the channel
    its actions are carried out on."""

    core: ListenerCore
    channel: Any


Q = TypeVar("Q", bound=PulledQueue)


class PullBase(Generic[Q]):
    """The client-neutral half of a pull connection: its node addresses, its queues
    (`Q`, each with a MANUAL core), whether it is closed."""

    _kind = "PullConnection"
    """The class's name in the errors it raises."""

    def __init__(
        self,
        url: str | Sequence[str],
        *,
        heartbeat: int = 30,
        tls: TLS | ssl.SSLContext | None = None,
    ) -> None:
        """`url`: the broker, or one URL per node of a cluster (tried in order, wrapping);
        `heartbeat`: AMQP heartbeat in seconds (0 turns it off); `tls`: an `ackkit.TLS`
        or an `ssl.SSLContext` for amqps:// URLs. Each is checked here."""
        self.urls = addresses.parse(url)
        """Every node's URL, in the order they are tried."""
        self.url = check_url(self.urls[0])
        self.heartbeat = C.integer("heartbeat", heartbeat, 0, C.MAX_SHORT)
        """The AMQP heartbeat in seconds asked for (0: none)."""
        self._tls = {u: client_tls(u, tls) for u in self.urls}
        self._rotation = addresses.Rotation(self.urls)
        self._queues: dict[str, Q] = {}  # per queue: its core and what carries it out
        self._closed = False
        self._setup_client()

    def _setup_client(self) -> None:
        """The client's half of the constructor (its connection state; the blocking one
        connects here), once the arguments are checked."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<{self._kind} {addresses.describe(self.urls)}>"

    @property
    def closed(self) -> bool:
        """close() was called (get, publish and settle refuse from then on)."""
        return self._closed

    def _check_open(self, what: str) -> None:
        if self._closed:
            raise RuntimeError(f"{what} on a closed {self._kind}")

    def _nodes(self, lost: bool) -> Iterator[tuple[str, bool]]:
        """The node addresses to connect to, each with whether it is the last to try:
        starting at the current one (after a `lost` connection, the next one), once
        around. Asking for the next one moves the rotation on (call `_failed` first)."""
        if lost:
            self._rotation.advance()
        for tries_left in range(len(self.urls) - 1, -1, -1):
            yield self._rotation.current, not tries_left
            self._rotation.advance()

    @staticmethod
    def _failed(url: str, why: str) -> None:
        """Connecting to `url` failed for a reason the next node may not have."""
        log.warning("connecting to %s failed: %s; trying the next node", mask_url(url), why)

    def _channel_gone(self) -> None:
        """The channel is gone: each queue's core marks its deliveries stale."""
        for q in self._queues.values():
            if q.core.open:
                q.core.channel_closed()

    def _channel_replaced(self, ch: Any) -> None:
        """A new channel `ch` took the place of the one that closed: every queue's core
        starts a new generation on it."""
        for q in self._queues.values():
            q.core.channel_closed()
            q.core.channel_opened()
            q.channel = ch

    @staticmethod
    def _new_core(
        queue: str, dead_letter: str | None, server_properties: Mapping[str, Any]
    ) -> ListenerCore:
        """The MANUAL core of a queue pulled from, on a broker with `server_properties`."""
        policy = ListenerPolicy.pull(queue, dead_letter)
        broker = traits_of(server_properties)
        # one channel; the DLQ is declared with the first dead letter, not here
        return ListenerCore(policy, shared_channel=True, broker=broker, declare_on_use=True)

    def _keep(self, queue: str, q: Q, ch: Any) -> Q:
        """Pull from `queue` through `q` from now on, starting on channel `ch`."""
        q.channel = ch
        q.core.channel_opened()
        self._queues[queue] = q
        return q

    def _settling(self, delivery: DeliveryBase, kind: str, channel_open: bool) -> Q:
        """The queue whose core settles `delivery` (`kind`: ack, nack or reject); its
        deliveries are stale first if the channel is no longer open. A delivery not yet
        settled cannot be once the connection is closed."""
        if self._closed and not delivery._tracked.settled:
            raise SettleNotAllowed(
                f"cannot {kind} delivery tag {delivery.delivery_tag}: its {self._kind} "
                "is closed (the broker requeued the message when its channel closed)"
            )
        q = self._queues[delivery.queue]
        if not channel_open:
            # every delivery fetched on the dead channel is stale: a settle of one of them
            # is dropped (the broker requeued it) and its tag never sent on a successor
            self._channel_gone()
        return q

    @staticmethod
    def _settled(q: Q, delivery: DeliveryBase, kind: str, acts: Sequence[Action]) -> None:
        """Log a settle that sent nothing because its delivery's channel closed."""
        if not acts and not q.core.current(delivery._tracked.generation):
            log.warning(
                "%s of delivery tag %d not sent: its channel closed and the broker requeued it",
                kind,
                delivery.delivery_tag,
            )


class Skips:
    """How many messages one get() call settled itself (dead-lettered) without handing
    one over, against its bounds: `max_skip` messages, about `max_seconds`."""

    __slots__ = ("count", "deadline", "max_skip", "queue")

    def __init__(self, queue: str, max_skip: int, max_seconds: float) -> None:
        self.queue = queue
        self.max_skip = max_skip
        self.deadline = time.monotonic() + max_seconds
        self.count = 0

    def one_more(self) -> bool:
        """One more message settled: True (logged) when the call must now return None."""
        self.count += 1
        if self.count >= self.max_skip or time.monotonic() >= self.deadline:
            log.warning(
                "get(%r): settled %d message(s) without handing one over; "
                "returning None, the queue may hold more",
                self.queue,
                self.count,
            )
            return True
        return False
