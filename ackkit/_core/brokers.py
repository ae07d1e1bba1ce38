"""What each RabbitMQ version does that ackkit's decisions depend on: one place.

A runtime reads the version its connection reports (`server_properties["version"]`)
and hands `traits_for(version)` to the listener core. Everything that differs
between broker versions is decided from these values, never from a version string
elsewhere:

- 3.8 - 3.9: quorum queues refuse `x-message-ttl` and know no at-least-once
  dead-lettering (`x-dead-letter-strategy`), so no quorum delay queue can exist.
- 3.x (3.8 - 3.13): a quorum queue's `x-delivery-count` counts every return
  (reject, nack, a lost consumer) and the broker writes it on every delivery;
  no default delivery limit; consumer timeouts close the channel.
- 4.0 - 4.2: as 3.x for counting; quorum queues get `x-delivery-limit` 20 by
  default; a publisher's `x-death` is ignored.
- 4.3 and later: only `basic.reject` (and a lost consumer) increments a quorum
  queue's `x-delivery-count`, `basic.nack requeue=true` does not; the header is
  written only once the broker incremented it (a publisher's value survives
  until then: seen on 4.3.6); `x-acquired-count` counts every acquisition and is
  always the broker's; native delayed retry on quorum queues; consumer timeouts
  (quorum queues only) cancel the consumer with `basic.cancel` instead of closing
  the channel; classic queue v1 arguments (`x-queue-mode`, `x-queue-version: 1`)
  and global QoS are refused; transient non-exclusive queues are denied; the
  `x-modulus-hash` exchange type is built in (shard layouts use it, see
  `ackkit.shards`; `x-consistent-hash` needs its plugin on every version).

A version that cannot be read gets `UNKNOWN`: no broker header is trusted for
counting (the redelivered flag and restamped copies count, which is right on
every version), no 4.3 feature is assumed, and nothing a newer broker refuses is
declared.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from enum import Enum
from typing import Any

from .headers import X_ACQUIRED_COUNT, X_DELIVERY_COUNT


class CountSource(str, Enum):
    """Where the number of previous deliveries of a copy comes from."""

    REDELIVERED = "redelivered"
    """The redelivered flag (at least one); a redelivery is restamped on a copy."""
    DELIVERY_COUNT = "x-delivery-count"
    """The quorum queue's x-delivery-count, read on redeliveries only."""
    ACQUIRED_COUNT = "x-acquired-count"
    """RabbitMQ 4.3's x-acquired-count, read on redeliveries only."""
    TRANSFER = "delivery-count"
    """AMQP 1.0's own count: the delivery-count of the message's header, which the broker
    writes on every delivery (never a header a publisher could set)."""

    def __str__(self) -> str:
        return self.value

    @property
    def header(self) -> str | None:
        """The header this source reads (None: the redelivered flag alone)."""
        if self is CountSource.DELIVERY_COUNT:
            return X_DELIVERY_COUNT
        if self is CountSource.ACQUIRED_COUNT:
            return X_ACQUIRED_COUNT
        return None


@dataclass(frozen=True, slots=True)
class BrokerTraits:
    """The semantics of one RabbitMQ version line that ackkit's decisions depend on."""

    series: str
    """"3.x", "4.0-4.2", "4.3+" or "unknown"."""
    version: tuple[int, int, int] | None = None
    """The version the connection reported, when it could be read."""
    quorum_counts_every_return: bool = False
    """x-delivery-count on a quorum queue counts every return, nack included (< 4.3)."""
    acquired_count: bool = False
    """The broker writes x-acquired-count (every acquisition) on redeliveries (4.3+)."""
    reject_counts_nack_does_not: bool = False
    """basic.reject counts toward a quorum queue's delivery-limit, basic.nack not (4.3+)."""
    default_delivery_limit: int | None = None
    """A quorum queue's delivery-limit when none is set (20 on 4.x)."""
    native_delayed_retry: bool = False
    """Quorum queues hold returned messages for a delay (x-delayed-retry-*; 4.3+)."""
    timeout_cancels_consumer: bool = False
    """A consumer timeout sends basic.cancel, the channel stays open (4.3+)."""
    classic_v1_arguments: bool = True
    """x-queue-mode and x-queue-version 1 may be declared (refused on 4.3+)."""
    global_qos: bool = True
    """basic.qos global=true is accepted (refused on 4.3+)."""
    transient_queues: bool = True
    """Transient (non-durable) non-exclusive queues may be declared (denied on 4.3+)."""
    honours_client_x_death: bool = True
    """The broker reads x-death a publisher set (ignored on 4.0+)."""
    modulus_hash_exchange: bool = False
    """The x-modulus-hash exchange type is built in (4.3+)."""
    amqp10: bool = False
    """The connection speaks AMQP 1.0 (`amqp10_traits`): `modified(delivery-failed)`
    counts an attempt on classic and quorum queues alike, `released` does not, and the
    count comes with every delivery, in the message's header (`count_source`)."""
    quorum_ttl_dead_letter: bool = True
    """Quorum queues take a queue-level x-message-ttl and dead-letter at-least-once
    (`x-dead-letter-strategy`), which a quorum delay queue needs (3.10+). True for an
    unknown version: a broker without them refuses the declare itself (406)."""

    def count_source(self, queue_type: str | None) -> CountSource:
        """Which header says how often a copy in a queue of `queue_type` was delivered
        before, in the sense ackkit counts attempts (handler runs and lost deliveries).

        - quorum before 4.3: x-delivery-count (every return increments it);
        - quorum on 4.3+: x-acquired-count: x-delivery-count misses a consumer
          timeout's return (the message would loop) and keeps a publisher's forged
          value until the broker first increments it;
        - anything else, or an unknown broker: the redelivered flag;
        - over AMQP 1.0: a quorum queue on 4.3+ as over 0-9-1 (x-acquired-count, an
          annotation there: the header's delivery-count misses a consumer timeout's
          return), any other queue the header's delivery-count.
        """
        if self.amqp10 and not (queue_type == "quorum" and self.acquired_count):
            return CountSource.TRANSFER
        if queue_type != "quorum":
            return CountSource.REDELIVERED
        if self.acquired_count:
            return CountSource.ACQUIRED_COUNT
        if self.quorum_counts_every_return:
            return CountSource.DELIVERY_COUNT
        return CountSource.REDELIVERED


V3 = BrokerTraits("3.x", quorum_counts_every_return=True)
V40 = BrokerTraits(
    "4.0-4.2",
    quorum_counts_every_return=True,
    default_delivery_limit=20,
    honours_client_x_death=False,
)
V43 = BrokerTraits(
    "4.3+",
    acquired_count=True,
    reject_counts_nack_does_not=True,
    default_delivery_limit=20,
    native_delayed_retry=True,
    timeout_cancels_consumer=True,
    classic_v1_arguments=False,
    global_qos=False,
    transient_queues=False,
    honours_client_x_death=False,
    modulus_hash_exchange=True,
)
UNKNOWN = BrokerTraits(
    "unknown",
    classic_v1_arguments=False,
    global_qos=False,
    transient_queues=False,
    honours_client_x_death=False,
)
"""A version that cannot be read: nothing trusted, nothing newer brokers refuse."""

_VERSION = re.compile(r"\s*v?(\d{1,4})\.(\d{1,4})(?:\.(\d{1,6}))?(?:[-+ ]|$)")


def parse_version(raw: object) -> tuple[int, int, int] | None:
    """(major, minor, patch) from a reported version ("4.3.6", "4.3.0-rc.0",
    "4.3.6+rc.1", b"3.10.8"); None for anything else."""
    if isinstance(raw, (bytes, bytearray)):
        raw = bytes(raw[:64]).decode("ascii", "replace")
    if not isinstance(raw, str):
        return None
    m = _VERSION.match(raw[:64])
    if m is None:
        return None
    return int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)


def traits_for(raw_version: object) -> BrokerTraits:
    """The traits of the broker that reported `raw_version` (UNKNOWN when unreadable or
    not a RabbitMQ 3.x/4.x version)."""
    v = parse_version(raw_version)
    if v is None:
        return UNKNOWN
    major, minor, _ = v
    if major == 3:
        base = V3 if minor >= 10 else replace(V3, quorum_ttl_dead_letter=False)
    elif major == 4 and minor < 3:
        base = V40
    elif major >= 4:
        base = V43
    else:
        return UNKNOWN
    return replace(base, version=v)


def amqp10_traits(traits: BrokerTraits, where: str) -> BrokerTraits:
    """`traits` for a connection speaking AMQP 1.0 to that broker. RabbitMQ serves AMQP
    1.0 natively from 4.0 on (3.x needs a plugin with other addresses and outcomes):
    ValueError naming the version (and `where`, the masked URL) for anything older or
    unreadable."""
    v = traits.version
    if v is None or v[0] < 4:
        seen = "an unreadable version" if v is None else f"RabbitMQ {v[0]}.{v[1]}.{v[2]}"
        raise ValueError(
            f"protocol='amqp1.0' needs RabbitMQ 4.0 or later, which serves AMQP 1.0 "
            f"natively; {where} reports {seen}: use protocol='amqp0-9-1' there"
        )
    return replace(traits, amqp10=True)


def traits_of(server_properties: Any) -> BrokerTraits:
    """The traits from a connection's server properties (a mapping, or anything else)."""
    get = getattr(server_properties, "get", None)
    if get is None:
        return UNKNOWN
    try:
        raw = get("version")
    except Exception:  # a hostile mapping: never let it break the connection
        return UNKNOWN
    return traits_for(raw)
