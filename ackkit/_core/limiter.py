"""The rate limiter (a token bucket) and the per-key serializer: no I/O, time passed in."""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Iterator
from typing import Generic, TypeVar

from .flow import RateLimit

T = TypeVar("T")


class TokenBucket:
    """GCRA, the token bucket as one number: `reserve(n, now)` books n starts and says
    how long to wait before they may begin. Over any span of s seconds, at most
    `burst + per_second * s` starts are booked to begin within it."""

    def __init__(self, cfg: RateLimit) -> None:
        self.interval = 1.0 / cfg.per_second
        self.tolerance = (cfg.burst - 1) * self.interval
        self.tat: float | None = None  # theoretical arrival time of the next start

    def reserve(self, n: int, now: float) -> float:
        """Seconds from `now` until `n` starts (a batch of n) may begin; books them."""
        tat = now if self.tat is None else max(self.tat, now)
        # the batch's last start must conform: its TAT minus the tolerance is not in the future
        last = tat + (n - 1) * self.interval
        begin = max(now, last - self.tolerance)
        self.tat = max(last, begin) + self.interval
        return begin - now


K = TypeVar("K", bound=Hashable)


class KeySerializer(Generic[T]):
    """At most one item per key runs; later items of a busy key wait, in arrival order.

    `arrive(key, item)`: True if it may run now (it holds the key), else it waits.
    `done(key)`: the key's running item ended; returns the next one (which now holds
    the key) or None. Items with key None are never held.
    """

    def __init__(self) -> None:
        self.waiting: dict[Hashable, deque[T]] = {}

    def arrive(self, key: Hashable | None, item: T) -> bool:
        if key is None:
            return True
        q = self.waiting.get(key)
        if q is None:
            self.waiting[key] = deque()  # the key is busy, nothing waits yet
            return True
        q.append(item)
        return False

    def done(self, key: Hashable | None) -> T | None:
        if key is None:
            return None
        q = self.waiting.get(key)
        if q is None:
            return None
        if not q:
            del self.waiting[key]
            return None
        return q.popleft()

    def busy(self, key: Hashable | None) -> bool:
        return key is not None and key in self.waiting

    def take_all(self) -> list[T]:
        """Every waiting item, taken out; keys whose item is running stay busy."""
        out: list[T] = []
        for q in self.waiting.values():
            out.extend(q)
            q.clear()
        return out

    def __iter__(self) -> Iterator[T]:
        for q in self.waiting.values():
            yield from q

    def __len__(self) -> int:
        return sum(len(q) for q in self.waiting.values())
