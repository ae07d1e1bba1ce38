"""The grouped values `listener()` takes: `Queue`, `Consumer`, `Batch`, `Flow`, `Publication`.

Each is a frozen value checked when it is built, so a wrong option fails at the line
that builds it (the decorator's line, when it is written inline). No I/O."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .._core import checks as C
from .._core.exchanges import Bind, Exchange, binds
from .._core.flow import CircuitBreaker, FlowPolicy, RateLimit, SerialKey
from .._core.policy import DEFAULT_PREFETCH, FlushPolicy
from .handler import DEFAULT_MAX_BODY

_DAY = 86_400.0
_INT32 = 2**31 - 1
MAX_CONCURRENCY = 10_000

BindOption = Bind | str | Exchange | tuple[str | Exchange, str] | Sequence[Any] | None
"""Queue(bind=...): see `ackkit._core.exchanges.binds`."""


@dataclass(frozen=True, init=False)
class Queue:
    """The queue a listener consumes (or one `app.declare(...)` declares for no
    listener), and how ackkit prepares it.

    `name`: the queue. `declare`: declare it (durable) before consuming, with the
    dead-letter and retry queues ackkit adds; False only checks that it exists.
    `arguments`: its x-arguments (`{"x-queue-type": "quorum"}`, `x-max-length`, ...).
    `bind`: exchanges to bind it to first: an `(exchange, routing_key)` pair, an exchange
    name or `Exchange`, a `Bind`, or a list of these (an exchange named by a string is
    declared as a durable topic exchange if it does not exist).
    `quorum`: replicate what ackkit declares for the listener on a cluster: the queue
    (its arguments get `x-queue-type: quorum`; with declare=False it says the queue is
    one), its retry delay queues and its dead-letter queue are quorum queues. An
    existing queue of another type is never converted: start() raises TopologyConflict.
    """

    name: str
    declare: bool = field(default=True, kw_only=True)
    arguments: dict[str, Any] = field(default_factory=dict, kw_only=True, hash=False)
    bind: tuple[Bind, ...] = field(default=(), kw_only=True)
    quorum: bool = field(default=False, kw_only=True)

    def __init__(
        self,
        name: str,
        *,
        declare: bool = True,
        arguments: dict[str, Any] | None = None,
        bind: BindOption = None,
        quorum: bool = False,
    ) -> None:
        C.queue_name("queue", name, declared=False)
        C.flag("Queue.declare", declare)
        if declare:
            C.queue_name("queue", name)
        args = C.amqp_table("Queue.arguments", arguments)
        if C.flag("Queue.quorum", quorum):
            if args.get("x-queue-type", "quorum") != "quorum":
                raise ValueError(
                    f"Queue(quorum=True) with arguments['x-queue-type'] "
                    f"{args['x-queue-type']!r}: a quorum queue's type is 'quorum'"
                )
            args = {**args, "x-queue-type": "quorum"}
        check_queue_arguments(name, args)
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "declare", declare)
        object.__setattr__(self, "arguments", args)
        object.__setattr__(self, "bind", binds(bind))
        object.__setattr__(self, "quorum", quorum)

    @property
    def queue_type(self) -> str | None:
        """The queue's x-queue-type argument ("classic", "quorum"), None when unset."""
        value = self.arguments.get("x-queue-type")
        return None if value is None else str(value)


def check_queue_arguments(queue: str, args: dict[str, Any]) -> None:
    """Arguments that contradict how ackkit consumes the queue."""
    qtype = args.get("x-queue-type")
    if qtype is not None and qtype not in ("classic", "quorum"):
        why = ""
        if qtype == "stream":
            why = ": a stream keeps messages after their ack, ackkit's settling does not apply"
        raise ValueError(
            f"Queue.arguments['x-queue-type'] must be 'classic' or 'quorum', got {qtype!r}{why}"
        )
    for key in (
        "x-message-ttl",
        "x-expires",
        "x-max-length",
        "x-max-length-bytes",
        "x-delivery-limit",
        "x-max-priority",
    ):
        if key in args:
            C.integer(f"Queue.arguments[{key!r}]", args[key], 0)
    if qtype == "quorum":
        # refused by quorum queues on 3.10 and 4.3 alike (406 "invalid arg ... of queue
        # type rabbit_quorum_queue"); 4.x quorum queues have priorities without one
        for key in ("x-max-priority", "x-queue-mode", "x-queue-version"):
            if key in args:
                raise ValueError(
                    f"Queue.arguments[{key!r}]: a quorum queue refuses it (RabbitMQ says "
                    "invalid arg); leave it out, or use a classic queue"
                )
    if "x-single-active-consumer" in args:
        C.flag("Queue.arguments['x-single-active-consumer']", args["x-single-active-consumer"])
    if args.get("x-dead-letter-routing-key") == queue and args.get("x-dead-letter-exchange") == "":
        raise ValueError(
            f"Queue.arguments dead-letter {queue!r} into itself "
            "(x-dead-letter-exchange '' and x-dead-letter-routing-key the queue): "
            "every rejected message would come straight back"
        )


_CONSUMER_NAMED = {"x-priority": "priority", "x-consumer-timeout": "timeout"}


@dataclass(frozen=True, kw_only=True)
class Consumer:
    """How a listener consumes its queue.

    `prefetch`: unacked deliveries the broker may send ahead (basic.qos; 0 is no limit).
    `concurrency`: handlers running at once. `exclusive`: no other consumer on the queue
    while this one is. `priority`: x-priority (higher-priority consumers get messages
    first). `timeout`: seconds a delivery may stay unacked (x-consumer-timeout).
    `arguments`: any other basic.consume arguments. `flush`: when pending acks are sent
    (a `FlushPolicy`; by default derived from the ack mode and prefetch).
    `max_body_size`: larger bodies are dead-lettered unread. `check_content_type`: a
    JSON handler refuses bodies whose content type says they are not JSON.
    """

    prefetch: int = DEFAULT_PREFETCH
    concurrency: int = 1
    exclusive: bool = False
    priority: int | None = None
    timeout: float | None = None
    arguments: dict[str, Any] | None = field(default=None, hash=False)
    """basic.consume arguments; None is read as {} (the value holds a dict)."""
    flush: FlushPolicy | None = None
    max_body_size: int = DEFAULT_MAX_BODY
    check_content_type: bool = True

    def __post_init__(self) -> None:
        C.integer("Consumer.prefetch", self.prefetch, 0, C.MAX_SHORT)
        C.integer("Consumer.concurrency", self.concurrency, 1, MAX_CONCURRENCY)
        C.flag("Consumer.exclusive", self.exclusive)
        args = C.amqp_table("Consumer.arguments", self.arguments)
        for key, option in _CONSUMER_NAMED.items():
            if key in args:
                raise ValueError(f"Consumer.arguments[{key!r}]: use Consumer({option}=...)")
        if self.priority is not None:
            C.integer("Consumer.priority", self.priority, -_INT32 - 1, _INT32)
        if self.timeout is not None:
            t = C.number("Consumer.timeout", self.timeout, 0, _DAY * 7, above=True)
            object.__setattr__(self, "timeout", t)
        object.__setattr__(self, "arguments", args)
        if self.flush is not None and not isinstance(self.flush, FlushPolicy):
            raise TypeError(f"Consumer.flush must be a FlushPolicy or None, got {self.flush!r}")
        C.integer("Consumer.max_body_size", self.max_body_size, 1)
        C.flag("Consumer.check_content_type", self.check_content_type)

    def consume_arguments(self) -> dict[str, Any]:
        """The basic.consume arguments: `arguments` with x-priority and
        x-consumer-timeout (in milliseconds) from `priority` and `timeout`."""
        args = dict(self.arguments or {})
        if self.priority is not None:
            args["x-priority"] = self.priority
        if self.timeout is not None:
            args["x-consumer-timeout"] = max(1, round(self.timeout * 1000))
        return args


@dataclass(frozen=True)
class Batch:
    """Hand a `list[...]` handler up to `size` deliveries at once, waiting at most
    `timeout` seconds for a batch to fill."""

    size: int
    timeout: float = 0.2

    def __post_init__(self) -> None:
        C.integer("Batch.size", self.size, 1, C.MAX_SHORT)
        object.__setattr__(self, "timeout", C.number("Batch.timeout", self.timeout, 0, _DAY))


@dataclass(frozen=True, init=False)
class Flow:
    """Flow control for one listener (all off by default).

    `circuit_breaker`: stop consuming while the handler keeps failing. `rate_limit`: a
    `RateLimit`, or messages per second: spaces handler starts. `serial_key`: never run
    two deliveries with the same key at once (and run them in arrival order).
    """

    circuit_breaker: CircuitBreaker | None = None
    rate_limit: RateLimit | None = None
    serial_key: SerialKey | None = None

    def __init__(
        self,
        *,
        circuit_breaker: CircuitBreaker | None = None,
        rate_limit: RateLimit | float | None = None,
        serial_key: SerialKey | None = None,
    ) -> None:
        if rate_limit is not None and not isinstance(rate_limit, RateLimit):
            if isinstance(rate_limit, bool) or not isinstance(rate_limit, int | float):
                raise TypeError(
                    "Flow.rate_limit must be a RateLimit, a number of messages per second "
                    f"or None, got {rate_limit!r}"
                )
            rate_limit = RateLimit(float(rate_limit))
        policy = FlowPolicy(breaker=circuit_breaker, rate_limit=rate_limit, serial_key=serial_key)
        object.__setattr__(self, "circuit_breaker", policy.breaker)
        object.__setattr__(self, "rate_limit", policy.rate_limit)
        object.__setattr__(self, "serial_key", policy.serial_key)

    def policy(self) -> FlowPolicy | None:
        """The core's FlowPolicy for these options; None when all are off."""
        if self.circuit_breaker is None and self.rate_limit is None and self.serial_key is None:
            return None
        return FlowPolicy(
            breaker=self.circuit_breaker, rate_limit=self.rate_limit, serial_key=self.serial_key
        )


@dataclass(frozen=True, init=False)
class Publication:
    """A message a listener's handler publishes, declared for the AsyncAPI document
    (`ackkit docs`): `listener(..., publishes=[Publication(...)])`.

    `exchange`: the exchange's name or an `Exchange` ("" is the default exchange, which
    routes by queue name: `routing_key` is then the queue). `routing_key`: the key it
    publishes with. `payload`: the body's type, as a handler's annotation (a pydantic
    model, `bytes`, `str`, `dict`, any type pydantic can describe; None: any JSON).
    Documentation only: it declares nothing and does not check what the handler sends.
    """

    exchange: str | Exchange
    routing_key: str = ""
    payload: Any = None

    def __init__(
        self, exchange: str | Exchange, routing_key: str = "", payload: Any = None
    ) -> None:
        if not isinstance(exchange, Exchange):
            C.text("Publication exchange", exchange, empty=True)
        C.text("Publication routing_key", routing_key, empty=True)
        if len(routing_key.encode()) > 255:
            raise ValueError(
                f"Publication routing_key longer than 255 bytes: {C.short(routing_key)}"
            )
        if exchange == "" and not routing_key:
            raise ValueError(
                "Publication: the default exchange '' needs the queue as its routing_key "
                "(it routes by queue name)"
            )
        _check_payload_type(payload)
        object.__setattr__(self, "exchange", exchange)
        object.__setattr__(self, "routing_key", routing_key)
        object.__setattr__(self, "payload", payload)

    @property
    def exchange_name(self) -> str:
        """The name of the exchange published to ("" for the default exchange)."""
        return self.exchange.name if isinstance(self.exchange, Exchange) else self.exchange


def _check_payload_type(payload: Any) -> None:
    """A payload type the document can describe: TypeError at once, not at `ackkit docs`."""
    if payload is None or payload in (bytes, str, dict, list):
        return
    from pydantic import TypeAdapter  # the handlers' annotations use it too

    try:
        TypeAdapter(payload).json_schema()
    except Exception as exc:
        raise TypeError(
            f"Publication payload {payload!r}: pydantic cannot describe it "
            f"({exc.__class__.__name__}); give a pydantic model, bytes, str, dict or a type "
            "pydantic validates"
        ) from None


def publications(option: object) -> tuple[Publication, ...]:
    """listener(publishes=...): one `Publication` or a list of them."""
    if option is None:
        return ()
    items = option if isinstance(option, list | tuple) else [option]
    unique: list[Publication] = []
    for item in items:
        if not isinstance(item, Publication):
            raise TypeError(
                f"publishes= takes Publication values (ackkit.Publication), or a list of them; "
                f"got {item!r}"
            )
        if item not in unique:
            unique.append(item)
    return tuple(unique)
