"""The in-memory broker's values: queues, exchanges, channels, messages, the clock.

Plain data and small pure rules (topic matching, argument equivalence, the
headers a message carries, the field types of the headers the broker writes:
`broker_written`); `_mem_topology` and `_mem_model` hold the state and apply
RabbitMQ's rules to it.
"""

from __future__ import annotations

import datetime as _dt
import struct
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from .._core import wire

NOT_FOUND, PRECONDITION_FAILED, ACCESS_REFUSED = 404, 406, 403


class ChannelError(Exception):
    """The broker closes the channel: `code` and `text` as RabbitMQ would send them."""

    def __init__(self, code: int, text: str) -> None:
        super().__init__(code, text)
        self.code = code
        self.text = text


class Sink(Protocol):
    """A client channel, as the model reaches it (called under the model's lock)."""

    def deliver(self, consumer_tag: str, tag: int, msg: Message, redelivered: bool) -> None: ...

    def closed(self, code: int, text: str) -> None: ...

    def cancelled(self, consumer_tag: str) -> None:
        """The broker cancelled this channel's consumer (basic.cancel: its queue was
        deleted); the channel stays open."""


class Clock:
    """Real time, scaled: `scale` 0 makes every TTL expire at once."""

    def __init__(self, scale: float = 1.0) -> None:
        self.scale = scale

    def now(self) -> float:
        return time.monotonic()


class ManualClock(Clock):
    """Time moves only when the test says so (`advance`)."""

    def __init__(self, scale: float = 1.0) -> None:
        super().__init__(scale)
        self._now = 0.0

    def now(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        self._now += seconds


@dataclass
class Message:
    body: bytes
    props: bytes
    """The basic properties as encoded on the wire (flags and property list)."""
    exchange: str
    routing_key: str
    seq: int = 0
    expires_at: float | None = None
    redelivered: bool = False
    returns: int = 0
    """How often it came back to its queue unsettled (4.3: x-acquired-count)."""
    counted: int = 0
    """The returns a quorum queue counts in x-delivery-count and toward its delivery
    limit (every return before 4.3; on 4.3 rejects and lost consumers only)."""
    deaths: list[dict[str, Any]] | None = None
    """The x-death the broker itself wrote (4.0+ ignores a publisher's); None: read the
    headers (before 4.0)."""

    def properties(self) -> dict[str, Any]:
        return wire.decode_properties(self.props)


@dataclass
class Consumer:
    tag: str
    queue: Queue
    channel: Channel
    no_ack: bool
    unacked: int = 0
    exclusive: bool = False


@dataclass
class Queue:
    name: str
    arguments: dict[str, Any]
    durable: bool = True
    ready: list[tuple[int, Message]] = field(default_factory=list)
    unacked: int = 0
    consumers: list[Consumer] = field(default_factory=list)
    turn: int = 0
    blocked: bool = False
    """A quorum reject-publish queue over its limit refuses publishes (rabbit_fifo)."""
    policy: dict[str, Any] = field(default_factory=dict)
    """The definition of the policy that applies to it (``set_policy``), e.g. max-length."""
    policy_name: str | None = None

    def arg(self, name: str) -> Any:
        """The argument `name` in effect: its own, or its policy's ("x-" dropped); with
        both, the lower of two limits or TTLs, else its own (RabbitMQ's resolution)."""
        own = self.arguments.get(name)
        if not self.policy or not name.startswith("x-"):
            return own
        ruled = self.policy.get(name[2:])
        if ruled is None:
            return own
        if own is None:
            return ruled
        if name in LOWER_WINS and _is_int(own) and _is_int(ruled):
            return min(own, ruled)
        return own

    @property
    def quorum(self) -> bool:
        return bool(self.arguments.get("x-queue-type") == "quorum")


LOWER_WINS = frozenset(
    {"x-max-length", "x-max-length-bytes", "x-message-ttl", "x-expires", "x-delivery-limit"}
)
"""Where a queue's argument and its policy both set a value, the lower one applies."""


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


@dataclass
class Binding:
    queue: str
    routing_key: str
    arguments: dict[str, Any]


@dataclass
class Exchange:
    name: str
    type: str
    durable: bool = True
    arguments: dict[str, Any] = field(default_factory=dict)
    bindings: list[Binding] = field(default_factory=list)


@dataclass
class Unacked:
    queue: Queue
    msg: Message
    consumer: Consumer | None


@dataclass
class Channel:
    number: int
    sink: Sink
    connection_name: str
    prefetch: int = 0
    next_tag: int = 1
    unacked: dict[int, Unacked] = field(default_factory=dict)
    consumers: dict[str, Consumer] = field(default_factory=dict)
    confirm: bool = False
    tx: bool = False
    tx_ops: list[Callable[[], None]] = field(default_factory=list)
    open: bool = True


def topic_matches(pattern: str, key: str) -> bool:
    """AMQP topic matching: `*` is one word, `#` zero or more words."""
    return _words(pattern.split("."), key.split(".") if key else [])


def _words(pat: list[str], words: list[str]) -> bool:
    if not pat:
        return not words
    head, rest = pat[0], pat[1:]
    if head == "#":
        return any(_words(rest, words[i:]) for i in range(len(words) + 1))
    if not words:
        return False
    return (head == "*" or head == words[0]) and _words(rest, words[1:])


CLASSIC_ARGUMENTS = frozenset(
    {
        "x-expires",
        "x-message-ttl",
        "x-dead-letter-exchange",
        "x-dead-letter-routing-key",
        "x-max-length",
        "x-max-length-bytes",
        "x-max-priority",
        "x-overflow",
        "x-queue-mode",
        "x-queue-version",
        "x-single-active-consumer",
        "x-queue-type",
        "x-queue-master-locator",
    }
)
"""The arguments a re-declare of a classic queue must repeat (RabbitMQ's
`rabbit_classic_queue:capabilities()` queue_arguments); any other may differ."""

QUORUM_ARGUMENTS = frozenset(
    {
        "x-dead-letter-exchange",
        "x-dead-letter-routing-key",
        "x-dead-letter-strategy",
        "x-expires",
        "x-max-length",
        "x-max-length-bytes",
        "x-max-in-memory-length",
        "x-max-in-memory-bytes",
        "x-overflow",
        "x-single-active-consumer",
        "x-queue-type",
        "x-quorum-initial-group-size",
        "x-delivery-limit",
        "x-message-ttl",
        "x-queue-leader-locator",
    }
)
"""The same for a quorum queue (`rabbit_quorum_queue:capabilities()`)."""


def inequivalent_arg(current: dict[str, Any], received: dict[str, Any]) -> str | None:
    """The first argument a re-declare with `received` may not change on a queue declared
    with `current`, or None. As RabbitMQ's `assert_args_equivalence`: only the arguments
    its queue type knows are compared (changed, added or left out); a custom `x-...`
    argument may differ. x-queue-type "classic" equals no x-queue-type."""

    def norm(d: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in d.items() if not (k == "x-queue-type" and v == "classic")}

    a, b = norm(current), norm(received)
    known = QUORUM_ARGUMENTS if a.get("x-queue-type") == "quorum" else CLASSIC_ARGUMENTS
    for key in sorted(known):
        if a.get(key) != b.get(key) or (key in a) != (key in b):
            return key
    return None


def copy_message(msg: Message) -> Message:
    deaths = None if msg.deaths is None else [dict(d) for d in msg.deaths]
    return Message(msg.body, msg.props, msg.exchange, msg.routing_key, deaths=deaths)


def expiration(msg: Message) -> int | None:
    exp = msg.properties().get("expiration")
    if exp is None:
        return None
    try:
        return max(int(exp), 0)
    except (TypeError, ValueError):
        return None


def python_headers(msg: Message) -> dict[str, Any]:
    """The message's headers as Python values (pika's table decoder)."""
    import pika.data

    raw = msg.properties().get("headers")
    if not raw:
        return {}
    table = wire.encode_table(raw)
    try:
        out: dict[str, Any] = pika.data.decode_table(table, 0)[0]
    except Exception:  # a table pika cannot read: route as if it had no headers
        return {}
    return out


BROKER_COUNTS = ("x-delivery-count", "x-acquired-count")
"""The count headers a quorum queue writes on a delivery."""


def broker_written(headers: Mapping[str, Any]) -> dict[str, Any]:
    """`headers` ready to encode, with the values the broker writes itself typed as
    RabbitMQ types them on the wire: x-delivery-count, x-acquired-count and each x-death
    entry's count a long-long ('l'), each x-death entry's time a timestamp ('T'); its
    text (reason, queue, exchange, routing keys, original-expiration) and the
    x-first-death-* / x-last-death-* headers long strings ('S'), as `wire` encodes text.

    So each client decodes them as it decodes RabbitMQ's: an x-death time is a datetime
    (not an int), a count pika's `long`. Every other value is left as it is (the
    publisher's headers are `wire.Field`s, written back byte for byte)."""
    out = dict(headers)
    for name in BROKER_COUNTS:
        if name in out:
            out[name] = _long_long(out[name])
    deaths = out.get("x-death")
    if isinstance(deaths, list):
        out["x-death"] = [_typed_death(d) if isinstance(d, Mapping) else d for d in deaths]
    return out


def _typed_death(entry: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(entry)
    if "count" in out:
        out["count"] = _long_long(out["count"])
    when = out.get("time")
    if isinstance(when, _dt.datetime):
        when = int(when.timestamp())
    if isinstance(when, int) and not isinstance(when, bool) and 0 <= when < 2**64:
        out["time"] = wire.Field(b"T" + struct.pack(">Q", when))
    return out


def _long_long(value: Any) -> Any:
    if isinstance(value, int) and not isinstance(value, bool) and -(2**63) <= value < 2**63:
        return wire.Field(b"l" + struct.pack(">q", value))
    return value
