"""What each settle action is over AMQP 1.0: the outcome a consumer gives the broker.

The core decides in AMQP 0-9-1's terms (`Ack`, `Nack`, `Reject`: a runtime on pika or
aio-pika sends them as frames). Over AMQP 1.0 a delivery is settled with one of four
outcomes, each with its own meaning to RabbitMQ 4.x, and this is the one rule that
picks it (the same on classic and quorum queues):

- `Ack`: `accepted`.
- A requeue that counts (`Reject(requeue=True)`: a failed attempt going back to its
  queue; `Nack(requeue=True)` from a handler's own `nack`): `modified` with
  `delivery-failed`. The broker adds one to the message's delivery-count, which is
  where the next delivery's attempt is read (`CountSource.TRANSFER`), and a quorum
  queue's delivery-limit applies.
- A requeue that does not count (`Nack(counts=False)`: given back unstarted by a stop,
  a pause or the flow gate, or a rolled-back transaction's succeeded handlers):
  `released`. No attempt is counted and the message is never dead-lettered for it.
- No requeue (`requeue=False`): `rejected`. The queue's own dead-letter exchange takes
  it, as it would a basic.reject; without one the broker drops it (the core decides
  this only where that is what the user asked for, as over 0-9-1).
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum
from typing import Any

from .actions import Ack, Nack, Reject
from .policy import AckMode


class Outcome(str, Enum):
    """An AMQP 1.0 delivery outcome (the terminal delivery state a receiver settles with)."""

    ACCEPTED = "accepted"
    RELEASED = "released"
    MODIFIED = "modified"
    """`modified` with `delivery-failed` set (and `undeliverable-here` not)."""
    REJECTED = "rejected"

    def __str__(self) -> str:
        return self.value


def outcome(action: Ack | Nack | Reject) -> Outcome:
    """The outcome that settles the delivery (or, with `multiple`, each delivery up to
    it) over AMQP 1.0."""
    if type(action) is Ack:
        return Outcome.ACCEPTED
    if not action.requeue:  # type: ignore[union-attr]
        return Outcome.REJECTED
    if type(action) is Nack and not action.counts:
        return Outcome.RELEASED
    return Outcome.MODIFIED


def unsupported(
    name: str, mode: AckMode, exclusive: bool, consumer_arguments: Mapping[str, Any]
) -> str | None:
    """Why listener `name` cannot run over AMQP 1.0 on RabbitMQ, in words (None: it can):
    RabbitMQ has no AMQP 1.0 transactions, and of 0-9-1's consumer options takes a
    consumer priority only (the link property ``rabbitmq:priority``)."""
    if mode is AckMode.TRANSACTED:
        return (
            f"{name}: AckMode.TRANSACTED needs AMQP transactions, which RabbitMQ offers "
            "over AMQP 0-9-1 only: use protocol='amqp0-9-1' for this app"
        )
    if exclusive:
        return (
            f"{name}: an exclusive consumer is an AMQP 0-9-1 option (basic.consume "
            "exclusive); over AMQP 1.0 use a single active consumer queue "
            "(x-single-active-consumer) instead"
        )
    other = sorted(k for k in consumer_arguments if k != "x-priority")
    if other:
        return (
            f"{name}: consumer arguments {other} have no AMQP 1.0 form here (only "
            "x-priority does: the link property rabbitmq:priority)"
        )
    return None


def redelivered(delivery_count: int, first_acquirer: bool, acquired: bool) -> bool:
    """Was this message delivered before (AMQP 0-9-1's redelivered flag, over AMQP 1.0)?

    `delivery_count` is the header's (the broker's count of failed deliveries);
    `first_acquirer` the header's flag; `acquired`: the message carries the annotation
    x-acquired-count. RabbitMQ 4.3 clears first-acquirer on a message dead-lettered into
    the queue (a retry copy back from its delay queue: never delivered from here), and
    passes a publisher's x-acquired-count through on a first delivery; a release (a
    consumer timeout's, a stop's) raises neither count but the acquired one. So: a
    counted delivery, or first-acquirer cleared on a message the queue has acquired."""
    return delivery_count > 0 or (not first_acquirer and acquired)
