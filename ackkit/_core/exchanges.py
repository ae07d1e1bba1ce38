"""Exchanges and bindings a listener asks for: values, and the plan a runtime declares.

`listener(..., bind=[("orders", "order.*")])` binds the listener's queue to an
exchange. An exchange named by a string is used as it is when it exists, and
declared as a durable topic exchange when it does not; an `Exchange(...)` value
is declared with exactly its options (the broker refuses a mismatch, and the
runtime raises TopologyConflict). `app.declare(...)` adds exchanges and queues no
listener consumes (an outbox's target, an audit queue). One app must agree with
itself on every exchange it names: `plan()` checks that at registration, and is
what a runtime declares once per connection, before consuming.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, cast

from . import checks as C
from .errors import TopologyConflict


class ExchangeType(str, Enum):
    """How an exchange routes a message to the queues bound to it."""

    DIRECT = "direct"
    """To the queues bound with exactly the message's routing key."""

    FANOUT = "fanout"
    """To every bound queue; routing keys are ignored."""

    TOPIC = "topic"
    """By pattern: binding key words separated by dots, `*` one word, `#` zero or more."""

    HEADERS = "headers"
    """By the message's headers, matched against the binding's arguments (`x-match`)."""


@dataclass(frozen=True)
class Exchange:
    """An exchange ackkit declares (with exactly these options) before binding to it.

    `declare=False`: it must exist already (checked, never declared). Names under
    the broker's reserved `amq.` prefix are always checked only.
    """

    name: str
    type: ExchangeType = ExchangeType.TOPIC
    durable: bool = True
    auto_delete: bool = False
    arguments: Mapping[str, Any] = field(default_factory=dict)
    declare: bool = True

    def __post_init__(self) -> None:
        C.text("Exchange name", self.name)
        if len(self.name.encode()) > 255 or any(ord(c) < 32 for c in self.name):
            raise ValueError(f"Exchange name {C.short(self.name)}: at most 255 bytes, no controls")
        object.__setattr__(self, "type", C.enum("Exchange type", ExchangeType, self.type))
        C.flag("Exchange durable", self.durable)
        C.flag("Exchange auto_delete", self.auto_delete)
        C.flag("Exchange declare", self.declare)
        object.__setattr__(self, "arguments", C.amqp_table("Exchange arguments", self.arguments))

    @property
    def passive(self) -> bool:
        """Only checked for existence (declare=False, or a reserved amq. name)."""
        return not self.declare or self.name.startswith("amq.")


@dataclass(frozen=True)
class Bind:
    """The listener's queue bound to `exchange` with `routing_key` (and `arguments`,
    for a headers exchange)."""

    exchange: str | Exchange
    routing_key: str = ""
    arguments: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.exchange, Exchange):
            C.text("bind exchange", self.exchange)
        C.text("bind routing_key", self.routing_key, empty=True)
        if len(self.routing_key.encode()) > 255:
            raise ValueError(f"bind routing_key longer than 255 bytes: {C.short(self.routing_key)}")
        object.__setattr__(self, "arguments", C.amqp_table("bind arguments", self.arguments))

    @property
    def exchange_name(self) -> str:
        """The name of the exchange bound to."""
        return self.exchange.name if isinstance(self.exchange, Exchange) else self.exchange


def binds(option: object) -> tuple[Bind, ...]:
    """listener(bind=...): a Bind, an exchange name or Exchange (routing key ""), an
    (exchange, routing_key) pair, or a list of these."""
    if option is None:
        return ()
    items = option if isinstance(option, list | tuple) and not _is_pair(option) else [option]
    out: list[Bind] = []
    for item in items:
        if isinstance(item, Bind):
            out.append(item)
        elif isinstance(item, str | Exchange):
            out.append(Bind(item))
        elif _is_pair(item):
            pair = cast(tuple[str | Exchange, str], item)
            out.append(Bind(pair[0], pair[1]))
        else:
            raise TypeError(
                "bind= takes (exchange, routing_key) pairs, exchange names, Exchange or Bind "
                f"values, or a list of them; got {item!r}"
            )
    if any(b.exchange_name == "" for b in out):
        raise ValueError(
            "bind= names the default exchange '', which routes by queue name and takes no "
            "bindings; name an exchange"
        )
    unique: list[Bind] = []
    for b in out:  # the same binding twice is one (compared by value: tables do not hash)
        if b not in unique:
            unique.append(b)
    return tuple(unique)


def _is_pair(x: object) -> bool:
    return (
        isinstance(x, tuple)
        and len(x) == 2
        and isinstance(x[0], str | Exchange)
        and isinstance(x[1], str)
    )


@dataclass(frozen=True, slots=True)
class ExchangeDecl:
    """An exchange a runtime declares (or only checks: `passive`) once per connection.
    `check_first`: named by a string; used as it is if it exists, else declared."""

    exchange: Exchange
    check_first: bool = False


@dataclass(frozen=True, slots=True)
class BindingDecl:
    """A binding of a listener's queue, declared (idempotently) after its exchange."""

    queue: str
    exchange: str
    routing_key: str
    arguments: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Plan:
    """What a runtime declares besides the listeners' queues: exchanges first, then the
    bindings; `queues`: those no listener consumes (checked or declared, see
    `preparation`)."""

    exchanges: tuple[ExchangeDecl, ...] = ()
    bindings: tuple[BindingDecl, ...] = ()
    queues: tuple[MustExist | DeclareQueue, ...] = ()


StandaloneQueue = tuple[str, bool, Mapping[str, Any], Sequence[Bind]]
"""A queue no listener consumes: (name, declare, arguments, binds)."""


def plan(
    listeners: Iterable[tuple[str, Sequence[Bind]]],
    exchanges: Iterable[Exchange] = (),
    queues: Iterable[StandaloneQueue] = (),
) -> Plan:
    """The exchanges and bindings of an app's listeners ((queue, binds) each) and of what
    it declares besides (`exchanges`, and `queues` no listener consumes), every exchange
    once; TopologyConflict when the app declares one exchange (or one queue of
    `queues`) two ways, or names a listener's queue in `queues`."""
    explicit: dict[str, Exchange] = {}
    named: dict[str, None] = {}
    bindings: list[BindingDecl] = []

    def add(e: Exchange) -> None:
        seen = explicit.setdefault(e.name, e)
        if seen != e:
            raise TopologyConflict(
                f"exchange {e.name!r} is declared two ways by this app: {_describe(seen)} and "
                f"{_describe(e)}; declare it once, the same way (or name it by its string "
                "elsewhere)"
            )

    for e in exchanges:
        add(e)
    consumed = list(listeners)
    standalone = list(queues)
    _check_standalone(standalone, {q for q, _ in consumed})
    for queue, bs in [*consumed, *((q[0], q[3]) for q in standalone)]:
        for b in bs:
            name = b.exchange_name
            if isinstance(b.exchange, Exchange):
                add(b.exchange)
            else:
                named[name] = None
            decl = BindingDecl(queue, name, b.routing_key, dict(b.arguments))
            if decl not in bindings:
                bindings.append(decl)
    decls = [ExchangeDecl(e) for e in explicit.values()]
    decls += [ExchangeDecl(Exchange(n), check_first=True) for n in named if n not in explicit]
    declared: list[MustExist | DeclareQueue] = []
    for name, declare, arguments, _ in standalone:
        step: MustExist | DeclareQueue = (
            DeclareQueue(name, dict(arguments), "declared queue", unless_exists=not arguments)
            if declare
            else MustExist(name)
        )
        if step not in declared:
            declared.append(step)
    return Plan(tuple(decls), tuple(bindings), tuple(declared))


def _check_standalone(queues: Sequence[StandaloneQueue], consumed: set[str]) -> None:
    """A queue `app.declare` names is neither a listener's queue nor named twice with
    other options: TopologyConflict (the broker would refuse the second declare)."""
    seen: dict[str, tuple[bool, Mapping[str, Any]]] = {}
    for name, declare, arguments, _ in queues:
        if name in consumed:
            raise TopologyConflict(
                f"queue {name!r} is a listener's queue and is named in app.declare(...) too; "
                "give its arguments and bindings in the listener's Queue(...) only"
            )
        first = seen.setdefault(name, (declare, arguments))
        if first != (declare, arguments):
            raise TopologyConflict(
                f"queue {name!r} is declared two ways by this app: declare={first[0]}, "
                f"arguments={dict(first[1])!r} and declare={declare}, arguments="
                f"{dict(arguments)!r}; declare it once (bindings may differ)"
            )


def _describe(e: Exchange) -> str:
    opts = [e.type.value]
    if not e.durable:
        opts.append("transient")
    if e.auto_delete:
        opts.append("auto_delete")
    if e.arguments:
        opts.append(f"arguments {dict(e.arguments)!r}")
    if not e.declare:
        opts.append("declare=False")
    return f"Exchange({', '.join(opts)})"


def conflict(what: str, broker_said: str) -> TopologyConflict:
    """The error for an exchange or binding the broker refused (406, 403, 404)."""
    return TopologyConflict(f"{what}: broker said: {broker_said}")


# -- preparation: what a runtime declares before it consumes or publishes, in order --------


@dataclass(frozen=True, slots=True)
class MustExist:
    """A queue only checked (a listener with declare=False): missing is a TopologyConflict."""

    name: str


@dataclass(frozen=True, slots=True)
class DeclareQueue:
    """A queue declared durable with `arguments`; `unless_exists`: asked for passively
    first, and left as it is when it exists (a listener's queue without arguments)."""

    name: str
    arguments: dict[str, Any]
    what: str
    unless_exists: bool = False


Step = MustExist | ExchangeDecl | DeclareQueue | BindingDecl


def preparation(
    own: Iterable[Any],
    user: Iterable[tuple[str, dict[str, Any]]] = (),
    existing: Iterable[str] = (),
    exchanges: Plan = Plan(),
) -> list[Step]:
    """The steps, in the order a runtime carries them out, each on a throwaway channel (a
    refusal costs that channel only): the `existing` queues (and the plan's queues to
    check) checked before anything is declared, then the exchanges, the listeners' queues
    (`user`: name, arguments), the plan's queues no listener consumes, ackkit's `own`
    queues (QueueSpec: name, arguments, purpose), then the bindings."""
    steps: list[Step] = [MustExist(name) for name in existing]
    steps += [q for q in exchanges.queues if isinstance(q, MustExist)]
    steps += exchanges.exchanges
    steps += [DeclareQueue(n, a, "listener queue", unless_exists=not a) for n, a in user]
    steps += [q for q in exchanges.queues if isinstance(q, DeclareQueue)]
    steps += [DeclareQueue(q.name, q.arguments, q.purpose) for q in own]
    steps += exchanges.bindings
    return steps


_INEQUIVALENT = re.compile(
    r"inequivalent arg '([^']{1,64})'.*?: received (.{1,120}?) but current is (.{1,120})$"
)


def mismatch(broker_said: str) -> str:
    """The argument a 406 "inequivalent arg" names, as "x-queue-type: the queue has
    'classic', ackkit declares 'quorum'"; "" when the broker said something else. A
    type change (classic to quorum) also says that RabbitMQ never converts a queue."""
    m = _INEQUIVALENT.search(broker_said[:1000])
    if m is None:
        return ""
    arg, received, current = m.groups()
    received = received.removeprefix("the value ").split(" of type ")[0]
    current = current.removeprefix("the value ").split(" of type ")[0]
    current = "none set" if current == "none" else current
    out = f"{arg}: the queue has {current}, ackkit declares {received}"
    if arg == "x-queue-type":
        out += (
            " (a queue's type never changes: move its messages elsewhere, delete it and "
            "start again, or declare it as it is)"
        )
    return out + ". "


def queue_conflict(step: DeclareQueue, broker_said: str) -> TopologyConflict:
    """The error for a queue that exists with other arguments (406)."""
    return TopologyConflict(
        f"{step.what} {step.name!r} already exists with arguments that differ from "
        f"{step.arguments!r}: {mismatch(broker_said)}broker said: {broker_said}. Delete it "
        "or align its arguments."
    )


def binding_name(b: BindingDecl) -> str:
    return f"binding of {b.queue!r} to {b.exchange!r} with {b.routing_key!r}"
