"""One logical stream over N queues, routed by a key: the queues, the exchange, a publisher.

RabbitMQ serves one queue on one core; more throughput comes from more queues. A
`ShardLayout` names N queues `<name>.shard-<i>` and how messages reach them:

* `ShardKind.MODULUS`: an `x-modulus-hash` exchange `<name>` (built into RabbitMQ 4.3+)
  routes a message to one bound queue by the hash of its routing key;
* `ShardKind.CONSISTENT`: an `x-consistent-hash` exchange (the
  `rabbitmq_consistent_hash_exchange` plugin, bundled with RabbitMQ 3.x and 4.x but
  disabled by default), every queue bound with weight 1;
* `ShardKind.CLIENT`: no exchange; the publisher picks the queue itself
  (CRC-32 of the key modulo N) and publishes to it through the default exchange. Works
  on any broker, but every producer must use the same rule (`ShardLayout.route`).
* `ShardKind.AUTO` (for `declare_shards`): MODULUS on RabbitMQ 4.3+, else CONSISTENT
  where the plugin is enabled, else an error that says what to enable (`auto_kinds`
  decides from the version the broker reports, `BrokerTraits.modulus_hash_exchange`).

Per-key order: every message with one key goes to one queue, and a queue keeps the
order it got them in, so messages of one key are consumed in the order they were
published (as long as the number of shards does not change: a new N maps keys anew).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from enum import Enum
from typing import Any

import pika
import pika.exceptions

from ._connection.url import mask_url
from ._core.brokers import BrokerTraits, traits_of

_EXCHANGE_TYPES = {"modulus": "x-modulus-hash", "consistent": "x-consistent-hash"}


class ShardKind(str, Enum):
    """How messages reach the shard queues (see the module doc)."""

    AUTO = "auto"
    MODULUS = "modulus"
    CONSISTENT = "consistent"
    CLIENT = "client"


def shard_queues(name: str, shards: int) -> tuple[str, ...]:
    """The queue names of `shards` shards of `name`: `<name>.shard-0` ... (no broker)."""
    if not isinstance(shards, int) or isinstance(shards, bool) or not 1 <= shards <= 1024:
        raise ValueError(f"shards must be an int in 1..1024, got {shards!r}")
    if not name or len(name) > 200:
        raise ValueError("the shard name must be 1..200 characters")
    return tuple(f"{name}.shard-{i}" for i in range(shards))


def _key_bytes(key: str | bytes) -> bytes:
    return key.encode() if isinstance(key, str) else bytes(key)


@dataclass(frozen=True)
class ShardLayout:
    """N queues behind one name, and how a key is routed to one of them."""

    name: str
    """The exchange (MODULUS, CONSISTENT), or only the queues' common prefix (CLIENT)."""
    shards: int
    kind: ShardKind

    def __post_init__(self) -> None:
        shard_queues(self.name, self.shards)  # validates
        if self.kind is ShardKind.AUTO:
            raise ValueError("a layout has a definite kind: declare_shards resolves AUTO")

    @property
    def queues(self) -> tuple[str, ...]:
        return shard_queues(self.name, self.shards)

    @property
    def exchange(self) -> str:
        """Where a producer publishes ("" for CLIENT: the default exchange)."""
        return "" if self.kind is ShardKind.CLIENT else self.name

    def queue_for(self, key: str | bytes) -> str:
        """The CLIENT rule: the queue of `key` (CRC-32 of its UTF-8 bytes modulo N)."""
        return self.queues[zlib.crc32(_key_bytes(key)) % self.shards]

    def route(self, key: str | bytes) -> tuple[str, str]:
        """(exchange, routing key) to publish a message with this key."""
        if self.kind is ShardKind.CLIENT:
            return "", self.queue_for(key)
        rk = key if isinstance(key, str) else _key_bytes(key).decode("utf-8", "replace")
        if len(rk.encode()) > 255:
            raise ValueError("a shard key is a routing key: at most 255 bytes")
        return self.name, rk


def auto_kinds(traits: BrokerTraits) -> tuple[ShardKind, ...]:
    """The hash exchanges `ShardKind.AUTO` tries, in this order, on a broker with these
    traits: the one place where the broker's version chooses the layout.

    x-modulus-hash first where it is built in (RabbitMQ 4.3+) and where the version
    cannot be read (a broker without it refuses the declaration), then x-consistent-hash;
    before 4.3 x-consistent-hash alone (its plugin can be enabled on any version)."""
    if traits.modulus_hash_exchange or traits.series == "unknown":
        return (ShardKind.MODULUS, ShardKind.CONSISTENT)
    return (ShardKind.CONSISTENT,)


def declare_shards(
    url: str, name: str, shards: int, *, kind: ShardKind | str = ShardKind.AUTO
) -> ShardLayout:
    """Declare the N durable shard queues (and the hashing exchange, bound to each).

    Idempotent: declaring the same layout again changes nothing. Raises ValueError when
    the kind cannot be had on this broker (AUTO: no hash exchange type of `auto_kinds`
    exists)."""
    kind = ShardKind(kind)
    queues = shard_queues(name, shards)
    refusals = []
    conn = pika.BlockingConnection(pika.URLParameters(url))
    try:
        traits = traits_of(conn._impl.server_properties)
        candidates = auto_kinds(traits) if kind is ShardKind.AUTO else (kind,)
        for k in candidates:
            if not conn.is_open:  # an unknown exchange type closed the connection (503)
                conn = pika.BlockingConnection(pika.URLParameters(url))
            ch = conn.channel()
            for q in queues:
                ch.queue_declare(q, durable=True)
            if k is ShardKind.CLIENT:
                return ShardLayout(name, shards, k)
            try:
                ch.exchange_declare(name, _EXCHANGE_TYPES[k.value], durable=True)
            except pika.exceptions.AMQPError as exc:
                code, text = getattr(exc, "reply_code", "?"), getattr(exc, "reply_text", exc)
                refusals.append(f"{_EXCHANGE_TYPES[k.value]}: {code} {text}")
                continue
            weight = "1" if k is ShardKind.CONSISTENT else ""
            for q in queues:
                ch.queue_bind(q, name, routing_key=weight)
            return ShardLayout(name, shards, k)
    finally:
        if conn.is_open:
            conn.close()
    version = ".".join(map(str, traits.version)) if traits.version else "of unknown version"
    raise ValueError(
        f"cannot declare the shard exchange {name!r} on {mask_url(url)} (RabbitMQ {version}: "
        + "; ".join(refusals)
        + "): use RabbitMQ 4.3+ (x-modulus-hash), enable the bundled plugin "
        "(rabbitmq-plugins enable rabbitmq_consistent_hash_exchange), or kind='client' "
        "(the publisher picks the queue)"
    )


def shards_beyond(
    url: str, name: str, shards: int, *, limit: int = 1024
) -> list[tuple[str, int, int]]:
    """The shard queues `<name>.shard-<shards>` and up that exist on the broker (each a
    `(queue, messages, consumers)` triple, from passive declares; the search stops at the
    first missing one). Declares nothing."""
    found: list[tuple[str, int, int]] = []
    conn = pika.BlockingConnection(pika.URLParameters(url))
    try:
        ch = conn.channel()
        for i in range(shards, limit):
            q = f"{name}.shard-{i}"
            try:
                ok = ch.queue_declare(q, passive=True)
            except pika.exceptions.ChannelClosedByBroker as exc:
                if exc.reply_code == 404:
                    break
                raise
            found.append((q, ok.method.message_count, ok.method.consumer_count))
    finally:
        if conn.is_open:
            conn.close()
    return found


class ShardPublisher:
    """Publishes on a pika channel through a layout: `publish(key, body, properties)`.

    Every message of one key goes to the same shard queue, in publish order."""

    def __init__(self, channel: Any, layout: ShardLayout) -> None:
        self.channel = channel
        self.layout = layout

    def publish(
        self,
        key: str | bytes,
        body: bytes,
        properties: pika.BasicProperties | None = None,
        *,
        mandatory: bool = False,
    ) -> None:
        exchange, rk = self.layout.route(key)
        self.channel.basic_publish(exchange, rk, body, properties, mandatory=mandatory)
