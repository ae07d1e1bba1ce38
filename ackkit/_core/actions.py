"""Actions: what the core asks a runtime to do on the channel, in order."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any


class CopyPurpose(str, Enum):
    """Why ackkit publishes a copy of a delivery (Republish.purpose)."""

    RETRY = "retry"
    """A broker retry: the copy waits in a delay queue, then goes back to the origin queue."""
    DEAD_LETTER = "dead-letter"
    """The dead letter: the copy goes to the listener's dead-letter queue with its reason."""
    RESTAMP = "restamp"
    """A redelivery from a queue that does not count deliveries: the copy goes back to
    the same queue carrying its attempt number."""

    def __str__(self) -> str:  # "retry", not "CopyPurpose.RETRY", in messages
        return self.value


class SettleKind(str, Enum):
    """How a handler settles a delivery itself (Delivery.ack / nack / reject)."""

    ACK = "ack"
    """basic.ack: processed."""
    NACK = "nack"
    """basic.nack: not processed; requeued, or dead-lettered without requeue."""
    REJECT = "reject"
    """basic.reject: like nack, for one delivery at a time."""

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True, slots=True)
class Ack:
    """basic.ack on the listener's current channel."""

    tag: int
    multiple: bool = False


@dataclass(frozen=True, slots=True)
class Nack:
    """basic.nack (RabbitMQ extension), the only negative settle with `multiple`."""

    tag: int
    multiple: bool = False
    requeue: bool = True
    counts: bool = field(default=True, compare=False)
    """Does the return count as a failed delivery? False for work that never failed: a
    delivery given back unstarted (a stop, a pause, the flow gate) or the succeeded
    handlers of a rolled-back transaction. basic.nack cannot say it; over AMQP 1.0 it is
    the outcome (`ackkit._core.settlement`)."""


@dataclass(frozen=True, slots=True)
class Reject:
    """basic.reject: one delivery, requeued or dropped / dead-lettered by the queue's DLX."""

    tag: int
    requeue: bool = False


@dataclass(frozen=True, slots=True)
class Republish:
    """Publish a copy of delivery `tag` (body and properties preserved) with confirms.

    `set_headers` are merged into the copy's headers (a value of None removes
    the header). When the broker has confirmed the publish, the runtime calls
    `ListenerCore.republished(token, ok)` and carries out what that returns
    (the ack of the original; a requeue when the publish failed).
    """

    token: int
    tag: int
    exchange: str
    routing_key: str
    set_headers: dict[str, Any] = field(default_factory=dict)
    purpose: CopyPurpose = CopyPurpose.RETRY
    declare: tuple[str, dict[str, Any]] | None = None
    """A queue (name, arguments) to declare before publishing, when not declared yet."""
    again_of: int = 0
    """The token of the copy this one repeats (sent once more after it was lost, or
    declaring its queue first): the runtime copies the same original (0: a first copy,
    of delivery `tag` of the generation it was decided for)."""
    minimal: bool = False
    """The copy carries the original's body and `set_headers` only (no property of the
    original): the fallback after a full copy could not be published."""


@dataclass(frozen=True, slots=True)
class Reinvoke:
    """Not an `Action`: the core's record (`Tracked.again`) that the handler runs again
    for delivery `tag` after `delay` seconds. `outcome.handled` turns it into
    `Outcome.rerun`, which is what a runtime sees of an in-process retry.
    """

    tag: int
    delay: float
    attempt: int


@dataclass(frozen=True, slots=True)
class TxCommit:
    """tx.commit on the listener's channel (SESSION_TRANSACTED mode)."""


@dataclass(frozen=True, slots=True)
class TxSelect:
    """tx.select on a freshly opened channel (SESSION_TRANSACTED mode)."""


@dataclass(frozen=True, slots=True)
class Start:
    """Start the handler of delivery `tag` (of the generation the action was decided for),
    a delivery the core held back until now: a restamp copy that arrived before the ack
    of the original it replaces was out. The runtime maps the tag to its own object."""

    tag: int


@dataclass(frozen=True, slots=True)
class Fence:
    """Wait until the broker has processed every frame sent on the listener's channel
    before this one, then carry out the actions after it (and nothing else on that
    channel meanwhile). A settle frame has no answer, and the client library may still
    hold it in its write buffer when the next action runs: the core puts a Fence
    between the ack of a restamp copy's original and the `Start` of that copy, so that
    a handler that kills its process cannot leave both in the queue. The runtime makes
    a no-op round trip on the channel (basic.qos with the listener's prefetch, answered
    in order); when the channel closes first, the actions after the Fence are dropped
    (the broker requeues the held copy)."""


@dataclass(frozen=True, slots=True)
class Consume:
    """Hold a consumer on the listener's queue (`on`: basic.consume if there is none) or
    not (basic.cancel). Paused, tripped or refused, a listener cancels its consumer
    before the deliveries it gives back go out (the actions after this one): a requeue
    the broker saw first would come straight back to the same consumer. Cancelled, the
    deliveries still queued for a handler go back as well (`Gating.withdraw`)."""

    on: bool


@dataclass(frozen=True, slots=True)
class Run:
    """Queue delivery `tag` (of the generation the action was decided for) for a handler:
    the flow gate let it through now (its serial key was freed, the breaker's probes
    succeeded). Unlike `Start` it has passed the gate already."""

    tag: int


Action = Ack | Nack | Reject | Republish | TxCommit | TxSelect | Fence | Start | Consume | Run
"""What a runtime carries out on the listener's channel, in order."""
