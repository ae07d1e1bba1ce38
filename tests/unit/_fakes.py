"""Shared by the unit tests that drive a listener core, or a runtime on fake channels:
a core with an open channel, a broker that checks settle frames, a channel that
forwards them to it."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

from ackkit import Retry
from ackkit._core.actions import Ack, Action, Nack, Reject, Republish
from ackkit._core.brokers import V3
from ackkit._core.listener import ListenerCore
from ackkit._core.policy import ListenerPolicy

RETRY3 = Retry(max_attempts=3, initial_interval=0.2)


def core(now: list[float] | None = None, **kw: Any) -> ListenerCore:
    """A listener core on RabbitMQ 3 traits with an open channel; `now[0]` is its wall
    clock (0.0 by default)."""
    kw.setdefault("name", "l")
    kw.setdefault("queue", "q")
    clock = now if now is not None else [0.0]
    c = ListenerCore(ListenerPolicy(**kw), wallclock=lambda: clock[0], broker=V3)
    c.channel_opened()
    return c


class Broker:
    """What the broker does with settle frames of one channel, in the order they arrive."""

    def __init__(self, tags: range) -> None:
        self.outstanding = set(tags)
        self.acked: list[int] = []
        self.requeued: list[int] = []

    def apply(self, acts: list[Action]) -> None:
        for a in acts:
            if isinstance(a, Republish):
                continue
            assert isinstance(a, Ack | Nack | Reject)
            if a.tag not in self.outstanding:
                raise AssertionError(f"PRECONDITION_FAILED - unknown delivery tag {a.tag}")
            many = getattr(a, "multiple", False)
            done = sorted(t for t in self.outstanding if t <= a.tag) if many else [a.tag]
            self.outstanding -= set(done)
            if isinstance(a, Ack) or not a.requeue:
                self.acked += done
            else:
                self.requeued += done


class FakeChannel:
    def __init__(self, broker: Broker, delays: dict[int, float] | None = None) -> None:
        self.broker = broker
        self.delays = delays or {}
        self.is_open = True
        self.is_closed = False
        self.channel_number = 1

    def basic_ack(self, tag: int, multiple: bool = False) -> None:
        self.broker.apply([Ack(tag, multiple)])

    def basic_reject(self, tag: int, requeue: bool = False) -> None:
        self.broker.apply([Reject(tag, requeue)])

    def basic_nack(self, tag: int, multiple: bool = False, requeue: bool = True) -> None:
        self.broker.apply([Nack(tag, multiple, requeue)])


def parse_source(path: Path) -> ast.Module:
    """ast.parse of a file, again on CPython 3.11's spurious SystemError ("AST constructor
    recursion depth mismatch", gh-106905: the AST converter's depth counter is shared, and
    a background thread left by an earlier test converting at the same moment upsets it)."""
    src = path.read_text(encoding="utf-8")
    for _ in range(4):
        try:
            return ast.parse(src, str(path))
        except SystemError as exc:
            if "recursion depth mismatch" not in str(exc):
                raise
    return ast.parse(src, str(path))
