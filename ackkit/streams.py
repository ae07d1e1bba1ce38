"""Publishing to RabbitMQ Streams, deduplicated by publishing id (effectively once).

RabbitMQ's recipe: a *named* producer gives every message a publishing id that grows
strictly; the broker remembers, per stream and producer name, the highest id it
stored and drops (and still confirms) any message whose id is not above it. A
producer that crashed and publishes its unconfirmed tail again, with the same ids,
therefore adds nothing twice:

    from ackkit.streams import StreamPublisher, StreamMessage

    with StreamPublisher(URL, stream="orders", name="orders-exporter") as pub:
        start = pub.last_publishing_id() + 1        # where the previous run stopped
        pub.publish([(start + i, StreamMessage(body, message_id=mid)) for i, ... in ...])

`publish` returns once the broker confirmed every message. The ids must come from the
application's own durable sequence (an outbox row id, a file offset...), so that a
message published again after a crash gets the same id. For a super stream, each
message is routed to a partition by its key (MurmurHash3 of the key, as RabbitMQ's
Java client does); each partition keeps its own highest id, and ids that grow overall
also grow within every partition. Needs rstream (`pip install 'ackkit[streams]'`).
"""

from __future__ import annotations

import asyncio
import threading
import urllib.parse
from collections.abc import Callable, Coroutine, Iterable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ._connection.url import check_url

T = TypeVar("T")
SEED = 104729
"""The MurmurHash3 seed RabbitMQ's stream clients route super stream messages with."""

__all__ = [
    "StreamMessage",
    "StreamPublishError",
    "StreamPublisher",
    "partition_for",
    "send_confirmed",
    "stream_connection",
]


def stream_connection(url: str, port: int = 5552) -> dict[str, Any]:
    """rstream connection arguments (host, port, credentials, virtual host) from an
    AMQP URL and the broker's stream port."""
    parts = urllib.parse.urlsplit(url)
    vhost = urllib.parse.unquote(parts.path[1:]) if len(parts.path) > 1 else "/"
    return {
        "host": parts.hostname or "localhost",
        "port": port,
        "username": urllib.parse.unquote(parts.username or "guest"),
        "password": urllib.parse.unquote(parts.password or "guest"),
        "vhost": vhost,
    }


@dataclass(frozen=True)
class StreamMessage:
    """A message for a stream: an AMQP 1.0 message with these properties."""

    body: bytes
    message_id: str | None = None
    headers: dict[str, str | int | float | bool] = field(default_factory=dict)
    """Application properties."""
    content_type: str | None = None
    key: str | None = None
    """The routing key of a super stream message (its partition); default message_id."""


def partition_for(key: str, partitions: Sequence[str]) -> str:
    """The partition of a super stream a routing key hashes to (unsigned MurmurHash3
    32-bit of the UTF-8 key, seed 104729, modulo the number of partitions)."""
    import mmh3

    if not partitions:
        raise ValueError("a super stream without partitions")
    return partitions[mmh3.hash(key.encode("utf-8"), SEED, signed=False) % len(partitions)]


class StreamPublisher:
    """A named, deduplicating stream producer with a blocking API (see the module doc).

    rstream is asyncio: the publisher runs a private event loop on a thread of its own;
    its methods block until the broker answered. Use it from one thread at a time."""

    def __init__(
        self,
        url: str,
        *,
        name: str,
        stream: str | None = None,
        super_stream: str | None = None,
        stream_port: int = 5552,
        confirm_timeout: float = 30.0,
    ) -> None:
        if (stream is None) == (super_stream is None):
            raise ValueError("give one of stream= or super_stream=")
        if not name:
            raise ValueError("deduplication needs a producer name")
        self.name = name
        self.stream = stream
        self.super_stream = super_stream
        self.confirm_timeout = confirm_timeout
        self._conn = stream_connection(check_url(url), stream_port)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name=f"ackkit-stream-publisher-{name}", daemon=True
        )
        self._thread.start()
        self._producer: Any = None
        self._partitions: list[str] | None = None
        self.published = 0
        """Messages confirmed by the broker (duplicates it dropped included)."""
        try:
            self._call(self._open())
        except BaseException:
            self.close()
            raise

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        fut: Future[T] = asyncio.run_coroutine_threadsafe(coro, self._loop)
        return fut.result()

    async def _open(self) -> None:
        import rstream

        self._producer = rstream.Producer(
            **self._conn, connection_name=f"ackkit-stream-publisher:{self.name}"
        )
        await self._producer.start()
        if self.super_stream is not None:
            client = await self._producer.default_client
            self._partitions = list(await client.partitions(self.super_stream))
            if not self._partitions:
                raise ValueError(f"super stream {self.super_stream!r} has no partitions")

    @property
    def partitions(self) -> list[str]:
        """The streams this publisher writes to (the super stream's partitions)."""
        return list(self._partitions) if self._partitions is not None else [str(self.stream)]

    def last_publishing_id(self, partition: str | None = None) -> int:
        """The highest publishing id the broker stored for this producer name (0 when
        none); for a super stream, the highest over its partitions (or of `partition`)."""

        async def query() -> int:
            client = await self._producer.default_client
            ids = [
                await client.query_publisher_sequence(stream=s, reference=self.name)
                for s in ([partition] if partition else self.partitions)
            ]
            return max(ids, default=0)

        return self._call(query())

    def publish(
        self,
        messages: Iterable[tuple[int, StreamMessage | bytes]],
        *,
        route: Callable[[StreamMessage], str] | None = None,
    ) -> int:
        """Publish `(publishing_id, message)` pairs, ids strictly growing, and wait for
        the broker's confirms; returns how many were confirmed. Ids at or below what the
        broker stored for this name are dropped by the broker (a republished tail)."""
        batches: dict[str, list[Any]] = {}
        last = 0
        for pid, msg in messages:
            if pid <= last:
                raise ValueError(f"publishing ids must grow strictly: {pid} after {last}")
            last = pid
            m = msg if isinstance(msg, StreamMessage) else StreamMessage(bytes(msg))
            if self._partitions is None:
                target = str(self.stream)
            else:
                key = route(m) if route else (m.key or m.message_id)
                if key is None:
                    raise ValueError("a super stream message needs a key (or a message_id)")
                target = partition_for(key, self._partitions)
            batches.setdefault(target, []).append(_encode(pid, m))
        return self._call(self._send(batches))

    async def _send(self, batches: dict[str, list[Any]]) -> int:
        total = 0
        for stream, msgs in batches.items():
            for i in range(0, len(msgs), 500):
                chunk = msgs[i : i + 500]
                await send_confirmed(
                    self._producer, stream, chunk, self.name, timeout=self.confirm_timeout
                )
                total += len(chunk)
        self.published += total
        return total

    def close(self) -> None:
        """Close the connection and stop the publisher's thread."""
        if self._producer is not None:
            try:
                self._call(self._producer.close())
            finally:
                self._producer = None
        if self._loop.is_running():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
        if not self._loop.is_running():
            self._loop.close()

    def __enter__(self) -> StreamPublisher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class StreamPublishError(RuntimeError):
    """The broker refused messages (a stream that does not exist, access refused...)."""


async def send_confirmed(
    producer: Any, stream: str, messages: Sequence[Any], name: str | None, timeout: float
) -> None:
    """Send `messages` (rstream messages with publishing ids) with rstream `producer` as
    producer `name`, and wait until the broker confirmed every one (TimeoutError after
    `timeout` s, StreamPublishError when it refused any)."""
    pending = {m.publishing_id for m in messages}
    done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    refused: list[Any] = []

    def on_confirm(status: Any) -> None:
        if not status.is_confirmed:
            refused.append(status)
        pending.discard(status.message_id)
        if not pending and not done.done():
            done.set_result(None)

    await producer.send_batch(stream, messages, publisher_name=name, on_publish_confirm=on_confirm)
    await asyncio.wait_for(done, timeout)
    if refused:
        raise StreamPublishError(
            f"stream {stream!r}: the broker refused {len(refused)} message(s) "
            f"(response code {refused[0].response_code})"
        )


def _encode(pid: int, m: StreamMessage) -> Any:
    from rstream import AMQPMessage
    from rstream._pyamqp.message import Properties  # type: ignore[attr-defined]

    props = Properties(message_id=m.message_id, content_type=m.content_type)
    msg = AMQPMessage(body=m.body, properties=props, application_properties=dict(m.headers) or None)
    msg.publishing_id = pid  # (a NamedTuple: not a constructor argument)
    return msg
