"""The queues a listener needs besides its own, and their names: values of its policy.

A listener with a dead-letter queue needs that queue; one with broker retries
needs a delay queue per backoff tier (`<queue>.retry.<ms>ms`: a TTL queue that
dead-letters back to the origin queue), and one more for each delay a
`RetryLater(delay=...)` asks for that is not a tier. Every name and argument
here follows from the `ListenerPolicy` alone; which extra delay queues are
declared already is the state of the listener's `Queues` part.

What each queue is, by the policy:

| queue | default | queue_type "quorum" | quorum=True |
|---|---|---|---|
| the listener's (declared) | the user's arguments | the user's arguments | + x-queue-type quorum |
| delay queues | classic, TTL per tier | quorum, TTL per tier, at-least-once | same |
| dead-letter queue | classic (no arguments) | classic | quorum, DLQ_DELIVERY_LIMIT |
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from .brokers import BrokerTraits
from .errors import TopologyConflict
from .policy import ListenerPolicy, Retry, RetryStrategy

if TYPE_CHECKING:
    from .actions import Republish

QUORUM_DEFAULT_DELIVERY_LIMIT = 20
"""A RabbitMQ 4.x quorum queue's delivery-limit when its arguments set none."""

DLQ_DELIVERY_LIMIT = 1_000_000
"""The x-delivery-limit of a quorum dead-letter queue: high enough never to apply.
Without one, RabbitMQ 4.0 - 4.2 would drop a dead letter (a DLQ has no DLX) once it
had been returned 20 times, and every `ackkit dlq inspect` returns each message it
read (basic.nack requeue, which those versions count). The same value on every
version, so that the queue's arguments do not change when the broker is upgraded
(RabbitMQ refuses a re-declare whose x-delivery-limit differs)."""


@dataclass(frozen=True, slots=True)
class QueueSpec:
    """A queue the listener needs (dead-letter queue, delay tier); declared idempotently."""

    name: str
    arguments: dict[str, Any]
    purpose: str


def missing_queue(name: str) -> str:
    """Why start() fails when a declare=False queue (a listener's, or one `app.declare`
    names) does not exist."""
    return (
        f"queue {name!r} does not exist, and its Queue has declare=False (checked only): "
        "declare the queue first, or let ackkit declare it (declare=True)"
    )


def round_delay_ms(delay: float) -> int:
    """The delay queue TTL (ms) for a delay of `delay` seconds: rounded up, coarser as it
    grows (1 ms below 1 s, 100 ms below 10 s, whole seconds above), so that asked-for
    delays share a few queues instead of one each."""
    ms = max(int(delay * 1000 + 0.999), 1)
    if ms > 10_000:
        return (ms + 999) // 1000 * 1000
    if ms > 1000:
        return (ms + 99) // 100 * 100
    return ms


def delay_spec(policy: ListenerPolicy, ms: int) -> QueueSpec:
    """The delay queue that holds retry copies for `ms` ms, then dead-letters them back."""
    args: dict[str, Any] = {
        "x-message-ttl": ms,
        "x-dead-letter-exchange": "",
        "x-dead-letter-routing-key": policy.queue,
    }
    if policy.queue_type == "quorum":
        # A classic queue dead-letters at-most-once: copies waiting in it when the
        # broker restarted never made it back into a quorum queue (the chaos run
        # lost 90 poison messages that way). A quorum queue with this strategy
        # keeps each copy until the origin queue has it (RabbitMQ 3.10+).
        args["x-queue-type"] = "quorum"
        args["x-dead-letter-strategy"] = "at-least-once"
        args["x-overflow"] = "reject-publish"  # at-least-once needs it
    return QueueSpec(policy.delay_queue(ms), args, "retry-delay")


def dead_letter_spec(policy: ListenerPolicy, name: str) -> QueueSpec:
    """The dead-letter queue `name`: classic with no arguments, or with `policy.quorum`
    a quorum queue whose delivery limit never applies (`DLQ_DELIVERY_LIMIT`)."""
    args: dict[str, Any] = {}
    if policy.quorum:
        args = {"x-queue-type": "quorum", "x-delivery-limit": DLQ_DELIVERY_LIMIT}
    return QueueSpec(name, args, "dead-letter")


def topology(policy: ListenerPolicy) -> list[QueueSpec]:
    """Queues ackkit declares for this listener: the DLQ and the retry delay tiers."""
    specs = []
    dlq = policy.dead_letter_queue
    if dlq is not None:
        specs.append(dead_letter_spec(policy, dlq))
    if policy.retry.strategy is RetryStrategy.BROKER and policy.retry.max_attempts > 1:
        for ms in policy.retry.delay_tiers_ms():
            specs.append(delay_spec(policy, ms))
    return specs


def extra_delay_queue(
    policy: ListenerPolicy, delay: float, declared: Collection[str] = ()
) -> QueueSpec | None:
    """The delay queue a RetryLater(delay=...) needs, if it is neither one of the tiers
    nor among `declared`."""
    ms = round_delay_ms(delay)
    if policy.delay_queue(ms) in declared or ms in policy.retry.delay_tiers_ms():
        return None
    return delay_spec(policy, ms)


def own_queue(policy: ListenerPolicy, name: str) -> QueueSpec | None:
    """The spec of `name` if it is one of this listener's own queues (its DLQ, a delay
    tier, or any delay queue of its naming scheme), else None."""
    for spec in topology(policy):
        if spec.name == name:
            return spec
    prefix = policy.delay_queue(0)[: -len("0ms")]
    ms = name[len(prefix) : -2]
    if name.startswith(prefix) and name.endswith("ms") and ms.isdigit():
        return delay_spec(policy, int(ms))
    return None


def _is_one(value: Any) -> bool:
    return not isinstance(value, bool) and (value == 1 or value in ("1", b"1"))


def declarable(
    arguments: Mapping[str, Any], broker: BrokerTraits
) -> tuple[dict[str, Any], tuple[str, ...]]:
    """The queue arguments to declare on `broker`, and the ones left off (as
    "name=value" texts for a warning).

    RabbitMQ 4.3 removed classic queue v1: `x-queue-version: 1` is refused (seen on
    4.3.6: PRECONDITION_FAILED "unsupported queue version") and `x-queue-mode` is
    listed as refused in the 4.3 release notes (4.3.6 still accepts and ignores it;
    lazy mode has been a no-op since CQv2 in 3.12). Both are left off on such a
    broker, and on one whose version is unknown; a queue gets CQv2 there anyway.
    """
    out = dict(arguments)
    if broker.classic_v1_arguments:
        return out, ()
    dropped: list[str] = []
    if "x-queue-mode" in out:
        dropped.append(f"x-queue-mode={out.pop('x-queue-mode')!r}")
    if "x-queue-version" in out and _is_one(out["x-queue-version"]):
        dropped.append(f"x-queue-version={out.pop('x-queue-version')!r}")
    return out, tuple(dropped)


def listener_arguments(
    policy: ListenerPolicy, broker: BrokerTraits, arguments: Mapping[str, Any]
) -> tuple[dict[str, Any], tuple[str, ...]]:
    """The listener queue's arguments to declare: the user's (x-queue-type quorum with
    `policy.quorum`), plus the native delayed retry's under RetryStrategy.QUORUM_DELAYED,
    minus what `broker` refuses."""
    args = dict(arguments)
    if policy.quorum:
        args["x-queue-type"] = "quorum"
    if policy.retry.strategy is RetryStrategy.QUORUM_DELAYED:
        args.update(policy.retry.quorum_delay_arguments())
    return declarable(args, broker)


def _seen(broker: BrokerTraits) -> str:
    return ".".join(map(str, broker.version)) if broker.version else "no readable version"


def check_broker(policy: ListenerPolicy, broker: BrokerTraits) -> None:
    """Raise TopologyConflict when the listener needs what `broker` does not have."""
    delays = policy.retry.strategy is RetryStrategy.BROKER and policy.retry.max_attempts > 1
    if delays and policy.queue_type == "quorum" and not broker.quorum_ttl_dead_letter:
        raise TopologyConflict(
            f"listener {policy.name!r}: its retry delay queues are quorum queues (the queue "
            "is one), which need RabbitMQ 3.10 or later (message TTL and at-least-once "
            f"dead-lettering on quorum queues); the broker reports {_seen(broker)}. "
            "Use RetryStrategy.IN_PROCESS, or classic queues."
        )
    if policy.retry.strategy is RetryStrategy.QUORUM_DELAYED and not broker.native_delayed_retry:
        raise TopologyConflict(
            f"listener {policy.name!r}: RetryStrategy.QUORUM_DELAYED needs RabbitMQ 4.3 or "
            f"later (quorum queues' native delayed retry); the broker reports {_seen(broker)}. Use "
            "RetryStrategy.BROKER (delay queues), which works on every version."
        )


def check_delivery_limit(retry: Retry, arguments: Mapping[str, Any]) -> None:
    """Under RetryStrategy.QUORUM_DELAYED every failed attempt is a basic.reject that the
    quorum queue's delivery-limit counts: a limit below max_attempts would make the
    broker drop (or dead-letter by its own DLX) the message before ackkit's last attempt."""
    if retry.strategy is not RetryStrategy.QUORUM_DELAYED:
        return
    limit = arguments.get("x-delivery-limit", QUORUM_DEFAULT_DELIVERY_LIMIT)
    if isinstance(limit, int) and 0 <= limit < retry.max_attempts:
        raise ValueError(
            f"Retry(max_attempts={retry.max_attempts}) with RetryStrategy.QUORUM_DELAYED: the "
            f"quorum queue's delivery-limit is {limit} (RabbitMQ 4.x's default 20 when "
            "queue_arguments set none), so the broker would drop the message before its "
            "attempts are used up; set queue_arguments['x-delivery-limit'] to at least "
            "max_attempts"
        )


class Declaring(Protocol):
    """What `Queues` uses of the listener's unconfirmed copies (republish.Confirms):
    making a copy just issued declare its queue before it is published."""

    def declaring(self, act: Republish, spec: QueueSpec) -> Republish:
        """`act`, declaring the queue `spec` before it is published."""
        ...


class Queues:
    """ListenerCore's part for the queues its listener needs: which to declare up front
    (`topology`), with which arguments on the broker it is connected to, and which
    extra delay queues and (pull mode) own queues its copies declared on first use.

    Handed the policy, the confirms (whose copies it makes declare their queue) and
    the broker; `use` tells it of the broker on every connect."""

    def __init__(
        self,
        policy: ListenerPolicy,
        confirms: Declaring,
        broker: BrokerTraits,
        *,
        declare_on_use: bool = False,
    ) -> None:
        self._policy = policy
        self.broker = broker
        # Pull mode: the DLQ and delay queues are declared with the first copy sent to
        # each (`Republish.declare`), not up front: a get() declares nothing unasked.
        self._declare_on_use = declare_on_use
        self._confirms = confirms
        self._declared: set[str] = set()

    def use(self, broker: BrokerTraits) -> None:
        """The connection reports this broker."""
        self.broker = broker

    def topology(self) -> list[QueueSpec]:
        """Queues ackkit declares for this listener: the DLQ and the retry delay tiers."""
        return topology(self._policy)

    def queue_arguments(
        self, arguments: Mapping[str, Any]
    ) -> tuple[dict[str, Any], tuple[str, ...]]:
        """The listener queue's arguments to declare on this broker, and those left off
        (see `topology.listener_arguments`)."""
        return listener_arguments(self._policy, self.broker, arguments)

    def check_broker(self) -> None:
        """Raise TopologyConflict when the listener needs what this broker lacks."""
        check_broker(self._policy, self.broker)

    def extra_delay_queue(self, delay: float) -> QueueSpec | None:
        """The delay queue a RetryLater(delay=...) needs, if it is not one of the tiers
        and not declared yet."""
        return extra_delay_queue(self._policy, delay, self._declared)

    def declared(self, name: str) -> None:
        """The runtime declared queue `name` (one not in `topology()`)."""
        self._declared.add(name)

    def asked_delay(self, act: Republish, delay: float) -> Republish:
        """Retry copy `act` for a RetryLater(delay=...), declaring its delay queue first
        when that is neither a tier nor declared already."""
        extra = self.extra_delay_queue(delay)
        if extra is None:
            return act
        self._declared.add(extra.name)
        return self._confirms.declaring(act, extra)

    def on_use(self, act: Republish) -> Republish:
        """`act`, declaring its queue first when this core declares its own queues on
        first use (`declare_on_use`, pull mode) and it has not declared that one yet."""
        if not self._declare_on_use or act.declare is not None or act.routing_key in self._declared:
            return act
        spec = own_queue(self._policy, act.routing_key)
        if spec is None:
            return act
        self._declared.add(spec.name)
        return self._confirms.declaring(act, spec)
