"""Immutable policy values: ack mode, retry, dead-lettering, flushing."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import Enum

from . import checks as C
from .flow import FlowPolicy
from .retry import DEFAULT_MULTIPLIER as DEFAULT_MULTIPLIER
from .retry import MAX_DELAY_TIERS as MAX_DELAY_TIERS
from .retry import NO_RETRY as NO_RETRY
from .retry import Retry as Retry
from .retry import RetryStrategy as RetryStrategy


class AckMode(str, Enum):
    """How deliveries of a listener are acknowledged."""

    NONE = "none"
    """basic.consume with no_ack: the broker forgets a message once it is written to
    the socket. A handler that fails, or a consumer that dies, loses it. Fastest."""

    AUTO = "auto"
    """ackkit acks after the handler returns (batched multiple-ack over the contiguous
    settled prefix); a raising handler goes through retry / dead-lettering, never an
    endless requeue loop. JMS AUTO_ACKNOWLEDGE."""

    MANUAL = "manual"
    """The handler settles with delivery.ack() / .nack() / .reject(). A handler that
    returns without settling is reported and settled by the listener's `on_unsettled`
    default, so the prefetch window never stalls."""

    CLIENT = "client"
    """JMS CLIENT_ACKNOWLEDGE: delivery.ack() acknowledges this delivery and every
    earlier one of the channel (multiple=True); handlers may leave deliveries
    unsettled for a later ack. A window filled with unsettled deliveries is reported
    and settled by `on_unsettled` instead of stalling."""

    DUPS_OK = "dups_ok"
    """JMS DUPS_OK_ACKNOWLEDGE: like AUTO with lazier ack batching (fewer frames; a
    crash redelivers more, so handlers must tolerate duplicates)."""

    INDIVIDUAL = "individual"
    """JMS INDIVIDUAL_ACKNOWLEDGE: like MANUAL, but every settle is sent at once for
    exactly that delivery (no batching, no multiple)."""

    TRANSACTED = "transacted"
    """JMS SESSION_TRANSACTED on AMQP tx: deliveries are settled in batches with
    tx.commit; if any handler of the batch fails, the others are requeued and the
    failed one goes through retry / dead-lettering."""


class Unsettled(str, Enum):
    """What happens to a delivery a MANUAL/CLIENT handler left unsettled."""

    DEAD_LETTER = "dead_letter"
    """Dead-letter it with reason 'unsettled' (the default: visible, nothing lost)."""

    REQUEUE = "requeue"
    """Put it back on the queue (risk: a loop if the handler always forgets)."""

    ACK = "ack"
    """Treat returning as success."""


@dataclass(frozen=True, slots=True)
class FlushPolicy:
    """When pending acks are sent: by count, by time, and always before cancel/close."""

    max_pending: int
    interval: float

    def __post_init__(self) -> None:
        C.integer("FlushPolicy.max_pending", self.max_pending, 1)
        iv = C.number("FlushPolicy.interval", self.interval, 0, 3600)
        object.__setattr__(self, "interval", iv)

    @staticmethod
    def for_mode(mode: AckMode, prefetch: int) -> FlushPolicy:
        """The default for an ack mode and prefetch: one ack at a time for INDIVIDUAL and
        NONE, otherwise a multiple-ack once about 65% of the window (at most 100) is
        settled, or after a short interval."""
        # ActiveMQ's optimizeAcknowledge: ack once 65% of the prefetch window is settled.
        if mode in (AckMode.INDIVIDUAL, AckMode.NONE) or prefetch <= 1:
            return FlushPolicy(max_pending=1, interval=0.0)
        count = max(1, int(prefetch * 0.65))
        if mode is AckMode.DUPS_OK:
            return FlushPolicy(max_pending=count, interval=1.0)
        # At most 100 deliveries per ack frame: with a large window, waiting for 65% of
        # it leaves the broker too few credits while the ack travels (measured: prefetch
        # 1000 drained ~1.2x faster acking every 100 than every 650).
        count = min(count, MAX_ACK_BATCH)
        if mode is AckMode.TRANSACTED:
            return FlushPolicy(max_pending=count, interval=0.2)
        return FlushPolicy(max_pending=count, interval=0.1)


DLQ_DEFAULT = "{queue}.dlq"
_DELAY_NAME = re.compile(r".*\.retry\.[0-9]+ms")
DEFAULT_PREFETCH = 1000
MAX_ACK_BATCH = 100


@dataclass(frozen=True, slots=True)
class ListenerPolicy:
    """Everything the core needs to decide for one listener."""

    name: str
    queue: str
    mode: AckMode = AckMode.AUTO
    prefetch: int = DEFAULT_PREFETCH
    retry: Retry = NO_RETRY
    dead_letter: str | None = DLQ_DEFAULT
    """Queue to publish dead letters to (with error headers), '{queue}' expanded.
    None: reject without requeue, so the queue's own DLX (if any) gets it."""
    on_unsettled: Unsettled = Unsettled.DEAD_LETTER
    flush: FlushPolicy | None = None
    retry_exchange: str = ""
    max_traceback: int = 4000
    queue_type: str | None = None
    """The origin queue's x-queue-type, when known: with "quorum" its retry delay
    queues are quorum queues too, which dead-letter back at-least-once."""
    quorum: bool = False
    """Every queue ackkit declares for this listener is a quorum queue: its own queue
    (where ackkit declares it), the delay queues and the dead-letter queue too
    (`Queue(name, quorum=True)`). Implies queue_type "quorum"."""
    flow: FlowPolicy | None = None
    """Circuit breaker, rate limit and per-key serial mode (None: all off)."""
    extra: dict[str, object] = field(default_factory=dict)

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        C.text("name", self.name)
        C.queue_name("queue", self.queue, declared=False)
        set_(self, "mode", C.enum("ack_mode", AckMode, self.mode))
        # basic.qos prefetch_count is an AMQP short; 0 means no limit
        C.integer("prefetch", self.prefetch, 0, C.MAX_SHORT)
        if not isinstance(self.retry, Retry):
            raise TypeError(f"retry must be a Retry or None, got {self.retry!r}")
        set_(self, "on_unsettled", C.enum("on_unsettled", Unsettled, self.on_unsettled))
        if self.flush is not None and not isinstance(self.flush, FlushPolicy):
            raise TypeError(f"flush must be a FlushPolicy or None, got {self.flush!r}")
        C.integer("max_traceback", self.max_traceback, 0)
        if self.flow is not None and not isinstance(self.flow, FlowPolicy):
            raise TypeError(f"flow must be a FlowPolicy or None, got {self.flow!r}")
        if self.flow is not None and self.flow.breaker is not None and self.mode is AckMode.NONE:
            raise ValueError(
                "circuit_breaker needs acknowledgements: a tripped breaker returns the "
                "deliveries it holds to the queue, and with AckMode.NONE the broker forgot "
                "them when it sent them"
            )
        if self.queue_type is not None:
            C.text("queue_arguments['x-queue-type']", self.queue_type)
        C.flag("quorum", self.quorum)
        if self.quorum:
            if self.queue_type not in (None, "quorum"):
                raise ValueError(
                    f"quorum=True declares {self.queue!r} a quorum queue, but its arguments "
                    f"say x-queue-type {self.queue_type!r}"
                )
            set_(self, "queue_type", "quorum")
        if self.mode is AckMode.NONE and self.retry.max_attempts > 1:
            raise ValueError("AckMode.NONE cannot retry: the broker forgot the message on send")
        if self.retry.strategy is RetryStrategy.QUORUM_DELAYED and self.queue_type != "quorum":
            raise ValueError(
                "RetryStrategy.QUORUM_DELAYED needs a quorum queue (RabbitMQ 4.3+): declare "
                "it with queue_arguments={'x-queue-type': 'quorum'}, or use "
                f"RetryStrategy.BROKER (queue type here: {self.queue_type or 'not given'})"
            )
        self._check_dead_letter()
        if self.retry.strategy is RetryStrategy.BROKER and self.retry.max_attempts > 1:
            # the longest name a delay queue can get (a RetryLater(delay=) included)
            longest = self.delay_queue(2**32 - 1)
            if len(longest.encode("utf-8")) > C.MAX_NAME_BYTES:
                raise ValueError(
                    f"queue {C.short(self.queue)} is too long for its retry delay queues: "
                    f"'<queue>.retry.<ms>ms' can be over {C.MAX_NAME_BYTES} bytes; shorten it "
                    "or use RetryStrategy.IN_PROCESS"
                )

    def _check_dead_letter(self) -> None:
        dl = self.dead_letter
        if dl is None:
            return
        C.text("dead_letter", dl, empty=True)
        if not dl:
            raise ValueError(
                "dead_letter='' would be a new server-named queue at every start; give a "
                "queue name, or dead_letter=None to leave failures to the queue's own DLX"
            )
        try:
            name = dl.format(queue=self.queue)
        except (KeyError, IndexError, ValueError, AttributeError) as exc:
            raise ValueError(
                f"dead_letter {dl!r} is not a valid template ({type(exc).__name__}: {exc}); "
                "the only field it may use is {queue}"
            ) from None
        if self.dead_letter_queue is None:
            return  # consuming a .dlq with the default: no dead-letter queue
        C.queue_name("dead_letter", name)
        if name == self.queue:
            raise ValueError(
                f"dead_letter {dl!r} is the listener's own queue {self.queue!r}: every dead "
                "letter would be delivered to it again"
            )
        if _DELAY_NAME.fullmatch(name) and name.startswith(f"{self.queue}.retry."):
            raise ValueError(
                f"dead_letter {dl!r} names one of the listener's retry delay queues "
                f"({name!r}), whose TTL would send every dead letter back to {self.queue!r}"
            )

    @classmethod
    def pull(cls, queue: str, dead_letter: str | None = DLQ_DEFAULT) -> ListenerPolicy:
        """Pull mode's listener for `queue`: prefetch 0 (basic.get), MANUAL (the caller
        settles each delivery), every settle sent at once."""
        return cls(
            name=f"pull:{queue}",
            queue=queue,
            mode=AckMode.MANUAL,
            prefetch=0,
            dead_letter=dead_letter,
            flush=FlushPolicy(max_pending=1, interval=0.0),
        )

    @property
    def flush_policy(self) -> FlushPolicy:
        return self.flush or FlushPolicy.for_mode(self.mode, self.prefetch)

    @property
    def dead_letter_queue(self) -> str | None:
        if self.dead_letter is None:
            return None
        if self.dead_letter == DLQ_DEFAULT and self.queue.endswith(".dlq"):
            return None  # consuming a dead-letter queue: no dead-letter queue of it by default
        return self.dead_letter.format(queue=self.queue)

    def delay_queue(self, tier_ms: int) -> str:
        return f"{self.queue}.retry.{tier_ms}ms"
