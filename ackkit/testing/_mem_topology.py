"""The in-memory broker's topology: queues, exchanges, bindings, routing.

Declares are checked as RabbitMQ checks them: a passive declare of a missing
queue or exchange is NOT_FOUND (404), a re-declare with other arguments or
another exchange type PRECONDITION_FAILED (406); both close the channel
(`ChannelError`). Routing follows the default, direct, fanout, topic and
headers exchanges.
"""

from __future__ import annotations

import itertools
import re
import threading
from dataclasses import dataclass
from typing import Any

from ._mem_rules import Rules, rules_for
from ._mem_state import (
    ACCESS_REFUSED,
    NOT_FOUND,
    PRECONDITION_FAILED,
    Binding,
    ChannelError,
    Clock,
    Exchange,
    Queue,
    inequivalent_arg,
    topic_matches,
)


@dataclass(frozen=True)
class Policy:
    name: str
    pattern: re.Pattern[str]
    definition: dict[str, Any]
    apply_to: str
    priority: int


class Topology:
    """Queues, exchanges and bindings of one in-memory broker (one virtual host), under
    the `rules` of one RabbitMQ version (`_mem_rules`)."""

    def __init__(self, clock: Clock | None = None, rules: Rules | None = None) -> None:
        self.lock = threading.RLock()
        self.clock = clock or Clock()
        self.rules = rules or rules_for(None)
        self.queues: dict[str, Queue] = {}
        self.exchanges: dict[str, Exchange] = {"": Exchange("", "direct")}
        for kind in ("direct", "fanout", "topic", "headers"):
            self.exchanges[f"amq.{kind}"] = Exchange(f"amq.{kind}", kind)
        self.channels: set[int] = set()
        self.policies: dict[str, Policy] = {}
        self._seq = itertools.count(1)
        self._ctag = itertools.count(1)
        self.changed = threading.Condition(self.lock)
        """Notified whenever a queue's contents change (timers, waits)."""

    # -- topology ---------------------------------------------------------------

    def queue_declare(
        self,
        name: str,
        *,
        passive: bool = False,
        durable: bool = True,
        exclusive: bool = False,
        arguments: dict[str, Any] | None = None,
    ) -> Queue:
        args = dict(arguments or {})
        with self.lock:
            q = self.queues.get(name)
            if passive:
                if q is None:
                    raise ChannelError(NOT_FOUND, f"NOT_FOUND - no queue '{name}' in vhost '/'")
                return q
            self.rules.check_queue_declare(name, durable, exclusive, args)
            if q is None:
                if not name:
                    name = f"amq.gen-{next(self._seq)}"
                q = self.queues[name] = Queue(name, args, durable)
                self._apply_policy(q)
                return q
            key = inequivalent_arg(q.arguments, args)
            if key is not None:
                raise ChannelError(
                    PRECONDITION_FAILED,
                    f"PRECONDITION_FAILED - inequivalent arg '{key}' for queue '{name}' in "
                    f"vhost '/': received {_shown(args, key)} but current is "
                    f"{_shown(q.arguments, key)}",
                )
            return q

    # -- policies -------------------------------------------------------------------

    def set_policy(
        self, name: str, pattern: str, definition: dict[str, Any], apply_to: str, priority: int
    ) -> None:
        with self.lock:
            self.policies[name] = Policy(name, re.compile(pattern), definition, apply_to, priority)
            for q in self.queues.values():
                self._apply_policy(q)
            self.changed.notify_all()

    def clear_policy(self, name: str) -> None:
        with self.lock:
            if self.policies.pop(name, None) is None:
                raise ChannelError(NOT_FOUND, f"NOT_FOUND - no policy '{name}' in vhost '/'")
            for q in self.queues.values():
                self._apply_policy(q)
            self.changed.notify_all()

    def _apply_policy(self, q: Queue) -> None:
        """The policy of `q`: of those whose pattern matches its name (and that apply to
        its type), the one with the highest priority."""
        best: Policy | None = None
        for p in self.policies.values():
            if not p.pattern.search(q.name):
                continue
            if p.apply_to == ("classic_queues" if q.quorum else "quorum_queues"):
                continue
            if best is None or p.priority > best.priority:
                best = p
        q.policy = dict(best.definition) if best else {}
        q.policy_name = best.name if best else None

    def queue_delete(self, name: str) -> int:
        with self.lock:
            q = self.queues.pop(name, None)
            if q is None:
                return 0
            for c in list(q.consumers):  # each gets basic.cancel (consumer_cancel_notify)
                c.channel.consumers.pop(c.tag, None)
                c.channel.sink.cancelled(c.tag)
            q.consumers.clear()
            for ex in self.exchanges.values():
                ex.bindings = [b for b in ex.bindings if b.queue != name]
            self.changed.notify_all()
            return len(q.ready)

    def queue_purge(self, name: str) -> int:
        with self.lock:
            q = self._queue(name)
            n = len(q.ready)
            q.ready.clear()
            q.blocked = False
            self.changed.notify_all()
            return n

    def exchange_declare(
        self,
        name: str,
        kind: str = "direct",
        *,
        passive: bool = False,
        durable: bool = True,
        arguments: dict[str, Any] | None = None,
    ) -> None:
        with self.lock:
            ex = self.exchanges.get(name)
            if passive:
                if ex is None:
                    raise ChannelError(NOT_FOUND, f"NOT_FOUND - no exchange '{name}' in vhost '/'")
                return
            if ex is None:
                if kind not in ("direct", "fanout", "topic", "headers"):
                    raise ChannelError(503, f"COMMAND_INVALID - unknown exchange type '{kind}'")
                self.exchanges[name] = Exchange(name, kind, durable, dict(arguments or {}))
            elif ex.type != kind or ex.durable != durable:
                raise ChannelError(
                    PRECONDITION_FAILED,
                    f"PRECONDITION_FAILED - inequivalent arg 'type' for exchange '{name}' in "
                    f"vhost '/': received '{kind}' but current is '{ex.type}'",
                )

    def exchange_delete(self, name: str) -> None:
        with self.lock:
            if name and not name.startswith("amq."):
                self.exchanges.pop(name, None)

    def queue_bind(
        self, queue: str, exchange: str, routing_key: str, arguments: dict[str, Any] | None = None
    ) -> None:
        with self.lock:
            self._queue(queue)
            ex = self._exchange(exchange)
            if not exchange:
                raise ChannelError(
                    ACCESS_REFUSED,
                    "ACCESS_REFUSED - operation not permitted on the default exchange",
                )
            b = Binding(queue, routing_key, dict(arguments or {}))
            if b not in ex.bindings:
                ex.bindings.append(b)

    def queue_unbind(self, queue: str, exchange: str, routing_key: str) -> None:
        with self.lock:
            ex = self._exchange(exchange)
            ex.bindings = [
                b for b in ex.bindings if not (b.queue == queue and b.routing_key == routing_key)
            ]

    def _queue(self, name: str) -> Queue:
        q = self.queues.get(name)
        if q is None:
            raise ChannelError(NOT_FOUND, f"NOT_FOUND - no queue '{name}' in vhost '/'")
        return q

    def _exchange(self, name: str) -> Exchange:
        ex = self.exchanges.get(name)
        if ex is None:
            raise ChannelError(NOT_FOUND, f"NOT_FOUND - no exchange '{name}' in vhost '/'")
        return ex

    # -- routing ----------------------------------------------------------------

    def route(self, exchange: str, routing_key: str, headers: dict[str, Any]) -> list[Queue]:
        ex = self._exchange(exchange)
        if ex.name == "":
            q = self.queues.get(routing_key)
            return [q] if q is not None else []
        names: list[str] = []
        for b in ex.bindings:
            if ex.type == "fanout":
                hit = True
            elif ex.type == "topic":
                hit = topic_matches(b.routing_key, routing_key)
            elif ex.type == "headers":
                want = {k: v for k, v in b.arguments.items() if not k.startswith("x-")}
                match_all = b.arguments.get("x-match", "all") in ("all", "all-with-x")
                hits = [headers.get(k) == v for k, v in want.items()]
                hit = all(hits) if match_all else any(hits)
            else:
                hit = b.routing_key == routing_key
            if hit and b.queue not in names:
                names.append(b.queue)
        return [self.queues[n] for n in names if n in self.queues]


def _shown(args: dict[str, Any], key: str) -> str:
    return f"the value '{args[key]}'" if key in args else "none"
