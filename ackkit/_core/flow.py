"""Flow control values: the listener state, the circuit breaker, the rate limit and the
per-key serial mode, as immutable options checked at once.

The decisions that use them live in `breaker`, `limiter` and `gate`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

from . import checks as C
from .errors import BadPayload, DeadLetterMessage, RejectMessage, RequeueMessage


class FlowState(str, Enum):
    """Whether a listener consumes, and why not."""

    CONSUMING = "consuming"
    """The listener has a consumer on its queue and runs deliveries."""
    PAUSED = "paused"
    """Paused by hand (`app.pause()`): no consumer; what it held went back to the queue."""
    TRIPPED = "tripped"
    """The circuit breaker tripped: no consumer until `CircuitBreaker.open_for` has passed;
    what it held went back to the queue without counting an attempt."""
    STANDBY = "standby"
    """Another consumer holds the queue exclusively (an `exclusive=True` listener of
    another instance, or any exclusive consumer): no consumer; the listener tries again
    every few seconds and consumes as soon as the queue frees (one WARNING when it starts
    waiting, one INFO when it takes over)."""
    PROBING = "probing"
    """Half-open: consuming again, with only `CircuitBreaker.probes` deliveries running;
    they all succeed: back to CONSUMING; one fails: TRIPPED again."""
    REFUSED = "refused"
    """The broker refuses the listener's copies (a dead-letter or delay queue full with
    `reject-publish`, no permission to publish there): no consumer for a while; each
    delivery whose copy was refused went back to its queue without counting an attempt.
    Consuming again after a backoff (1 s, doubling up to 60 s) to try once more; a copy
    the broker confirms ends it."""


class KeySource(str, Enum):
    """Where a `SerialKey` reads a delivery's key."""

    HEADER = "header"
    """A message header (e.g. "customer-id")."""
    PROPERTY = "property"
    """A message property: message_id, correlation_id, user_id, app_id, type, or the
    delivery's routing_key."""


KEY_PROPERTIES = ("message_id", "correlation_id", "user_id", "app_id", "type", "routing_key")

# A handler that chose an outcome, or a body that cannot be read, says nothing about
# the health of what the handler depends on: never a breaker failure.
NOT_A_DEPENDENCY_FAILURE: tuple[type[BaseException], ...] = (
    BadPayload,
    DeadLetterMessage,
    RejectMessage,
    RequeueMessage,
)


@dataclass(frozen=True, slots=True)
class CircuitBreaker:
    """Stop consuming while what the handler depends on is failing (MassTransit's kill switch).

    Trips when, over the last `window` seconds, at least `min_attempts` handler calls
    ended and `failure_ratio` of them or more raised one of `trip_on` (RetryLater
    included; BadPayload and the other outcome signals never count). Tripped, the
    listener cancels its consumer and returns every delivery it held to the queue
    (basic.nack requeue, not counted as an attempt); calls already running finish.
    After `open_for` seconds it consumes again and lets `probes` deliveries run:
    all succeed -> consuming again; one fails -> tripped again for `open_for`.
    """

    failure_ratio: float = 0.5
    window: float = 30.0
    min_attempts: int = 10
    open_for: float = 30.0
    probes: int = 1
    trip_on: tuple[type[BaseException], ...] = (Exception,)

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        ratio = C.number("CircuitBreaker.failure_ratio", self.failure_ratio, 0, 1, above=True)
        set_(self, "failure_ratio", ratio)
        set_(self, "window", C.number("CircuitBreaker.window", self.window, 0, 86_400, above=True))
        C.integer("CircuitBreaker.min_attempts", self.min_attempts, 1, 1_000_000)
        open_for = C.number("CircuitBreaker.open_for", self.open_for, 0, 86_400, above=True)
        set_(self, "open_for", open_for)
        C.integer("CircuitBreaker.probes", self.probes, 1, C.MAX_SHORT)
        set_(self, "trip_on", C.exception_types("CircuitBreaker.trip_on", self.trip_on))

    def counts(self, exc: BaseException | None) -> bool:
        """Is a call that raised `exc` (None: it returned) a failure for the breaker?"""
        if exc is None or isinstance(exc, NOT_A_DEPENDENCY_FAILURE):
            return False
        return isinstance(exc, self.trip_on)


MIN_RATE = 1 / 86400
"""The slowest RateLimit.per_second: one handler start a day."""


@dataclass(frozen=True, slots=True)
class RateLimit:
    """At most `per_second` handler starts a second for one listener (one process), with
    up to `burst` at once after a quiet spell. A batch counts each of its deliveries.
    The budget is the listener's, so a reconnect does not reset it."""

    per_second: float
    burst: int = 1

    def __post_init__(self) -> None:
        rate = C.number("RateLimit.per_second", self.per_second, 0, 1_000_000, above=True)
        if rate < MIN_RATE:
            # A slower rate spaces starts by more than a day: a worker's wait for its turn
            # then overflows the thread timer (App stopped at the second delivery), and a
            # rate below ~1e-308 made the bucket's interval infinite (no limit at all).
            raise ValueError(
                "RateLimit.per_second must be at least one start a day (1/86400 = "
                f"{MIN_RATE:.3g}) and at most 1000000, got {self.per_second!r}"
            )
        object.__setattr__(self, "per_second", rate)
        C.integer("RateLimit.burst", self.burst, 1, 1_000_000)


@dataclass(frozen=True, slots=True)
class SerialKey:
    """Per-key serial mode: deliveries with the same key never run at the same time, and
    run in the order they arrived; a key's failure (an in-process retry) holds back that
    key only. Deliveries without the key are not held back by anything.

    `SerialKey.header("customer-id")` or `SerialKey.property("correlation_id")`.
    """

    name: str
    source: KeySource = KeySource.HEADER

    def __post_init__(self) -> None:
        C.text("SerialKey.name", self.name)
        source = C.enum("SerialKey.source", KeySource, self.source)
        object.__setattr__(self, "source", source)
        if source is KeySource.PROPERTY and self.name not in KEY_PROPERTIES:
            raise ValueError(
                f"SerialKey.property must be one of {', '.join(KEY_PROPERTIES)}, got {self.name!r}"
            )

    @classmethod
    def header(cls, name: str) -> SerialKey:
        """Key deliveries by the message header `name`."""
        return cls(name, KeySource.HEADER)

    @classmethod
    def property(cls, name: str) -> SerialKey:
        """Key deliveries by a message property (message_id, correlation_id, user_id,
        app_id, type) or by the routing_key."""
        return cls(name, KeySource.PROPERTY)

    def of(
        self, headers: Mapping[str, Any] | None, properties: Any, routing_key: str = ""
    ) -> object | None:
        """The key of a delivery (None: it has none). Bytes and str keys are the same key."""
        if self.source is KeySource.HEADER:
            value = headers.get(self.name) if headers else None
        elif self.name == "routing_key":
            value = routing_key
        else:
            value = getattr(properties, self.name, None)
        if isinstance(value, bytes):
            value = value.decode("utf-8", "replace")
        if value is None or value == "":
            return None
        try:
            hash(value)
        except TypeError:  # a table or array header: its text is the key
            return repr(value)
        return value


@dataclass(frozen=True, slots=True)
class FlowPolicy:
    """A listener's flow control options (all off by default)."""

    breaker: CircuitBreaker | None = None
    rate_limit: RateLimit | None = None
    serial_key: SerialKey | None = None

    def __post_init__(self) -> None:
        for name, cls in (
            ("circuit_breaker", CircuitBreaker),
            ("rate_limit", RateLimit),
            ("serial_key", SerialKey),
        ):
            value = getattr(self, "breaker" if name == "circuit_breaker" else name)
            if value is not None and not isinstance(value, cls):
                raise TypeError(f"{name} must be a {cls.__name__} or None, got {value!r}")


NO_FLOW = FlowPolicy()
