"""The circuit breaker's state machine: closed, open, half-open (no I/O, time passed in).

Outcomes are counted in `STEPS` time buckets per window, so memory stays bounded
whatever the throughput: the window counted at time `now` is the buckets that
started within the last `window` seconds (between `window - window/STEPS` and
`window` seconds of history).
"""

from __future__ import annotations

import math
from collections import deque
from enum import Enum

from .flow import CircuitBreaker

STEPS = 100
"""Buckets per window."""


class BreakerState(str, Enum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


class Breaker:
    """One listener's breaker. Call `record()` with each handler call's outcome and
    `poll()` to move from open to half-open once `open_for` has passed."""

    def __init__(self, cfg: CircuitBreaker) -> None:
        self.cfg = cfg
        self.state = BreakerState.CLOSED
        self.width = cfg.window / STEPS
        # (bucket index, calls, failures), oldest first
        self.buckets: deque[list[int]] = deque()
        self.calls = 0
        self.failures = 0
        self.until = 0.0  # open: when probing may start
        self.probe_ok = 0  # half-open: probes that succeeded
        self.trips = 0

    def _trim(self, now: float) -> int:
        b = math.floor(now / self.width)
        oldest = b - STEPS + 1
        while self.buckets and self.buckets[0][0] < oldest:
            _, n, f = self.buckets.popleft()
            self.calls -= n
            self.failures -= f
        return b

    def window_counts(self, now: float) -> tuple[int, int]:
        """(calls, failures) counted in the window at `now`."""
        self._trim(now)
        return self.calls, self.failures

    def record(self, failed: bool, now: float) -> bool:
        """A handler call ended (`failed`: it raised a counted failure). True when this
        outcome tripped the breaker (it is open from now on)."""
        if self.state is BreakerState.OPEN:
            return False  # a call that started before the trip: no news
        if self.state is BreakerState.HALF_OPEN:
            if failed:
                self._open(now)
                return True
            self.probe_ok += 1
            if self.probe_ok >= self.cfg.probes:
                self._close()
            return False
        b = self._trim(now)
        if self.buckets and self.buckets[-1][0] == b:
            last = self.buckets[-1]
        else:
            last = [b, 0, 0]
            self.buckets.append(last)
        last[1] += 1
        self.calls += 1
        if failed:
            last[2] += 1
            self.failures += 1
            if (
                self.calls >= self.cfg.min_attempts
                and self.failures >= self.cfg.failure_ratio * self.calls
            ):
                self._open(now)
                return True
        return False

    def poll(self, now: float) -> bool:
        """True when the breaker moved from open to half-open now."""
        if self.state is BreakerState.OPEN and now >= self.until:
            self.state = BreakerState.HALF_OPEN
            self.probe_ok = 0
            return True
        return False

    def _open(self, now: float) -> None:
        self.state = BreakerState.OPEN
        self.until = now + self.cfg.open_for
        self.trips += 1
        self.buckets.clear()
        self.calls = self.failures = 0

    def _close(self) -> None:
        self.state = BreakerState.CLOSED
        self.buckets.clear()
        self.calls = self.failures = 0
