"""The in-memory broker's values: queues, exchanges, channels, messages, the clock.

Plain data and small pure rules (topic matching, argument equivalence, the
headers a message carries); `_mem_topology` and `_mem_model` hold the state and
apply RabbitMQ's rules to it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
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


@dataclass
class Queue:
    name: str
    arguments: dict[str, Any]
    durable: bool = True
    ready: list[tuple[int, Message]] = field(default_factory=list)
    unacked: int = 0
    consumers: list[Consumer] = field(default_factory=list)
    turn: int = 0

    def arg(self, name: str) -> Any:
        return self.arguments.get(name)

    @property
    def quorum(self) -> bool:
        return bool(self.arg("x-queue-type") == "quorum")


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


def same_args(a: dict[str, Any], b: dict[str, Any]) -> bool:
    def norm(d: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in d.items() if not (k == "x-queue-type" and v == "classic")}

    return norm(a) == norm(b)


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
