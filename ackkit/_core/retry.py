"""Retry: where a failed delivery waits and how long (frozen, self-validating)."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from enum import Enum

from . import checks as C
from .headers import MAX_ATTEMPT_HEADER


class RetryStrategy(str, Enum):
    """Where a failed delivery waits before its next attempt."""

    BROKER = "broker"
    """Republish (confirmed) to a TTL delay queue that dead-letters back to the origin
    queue, then ack the original. Survives restarts; nothing held in memory."""

    IN_PROCESS = "in_process"
    """Re-invoke the handler after a backoff while the delivery stays unacked. For
    short transient errors; bounded by the broker's consumer_timeout."""

    QUORUM_DELAYED = "quorum_delayed"
    """RabbitMQ 4.3+ quorum queues only: basic.reject the delivery back to its queue,
    which holds it for min(initial_interval * n, max_interval) (n: its failed deliveries
    so far, a linear delay) before delivering it again. Nothing is republished and no
    delay queue is declared; ackkit declares the queue with x-delayed-retry-type
    'failed' and -min / -max from the Retry. No jitter, no multiplier, and a
    RetryLater's own delay cannot be honoured (AMQP 0-9-1 has no per-message delay)."""


@dataclass(frozen=True, slots=True)
class Retry:
    """Bounded retry: `max_attempts` counts every invocation, the first one included.

    Delay before attempt n+1 is `initial_interval * multiplier**(n-1)`, capped at
    `max_interval`, spread by +/- `jitter` (a fraction). `retry_on` lists the
    exception types worth another attempt; `fatal` ones go straight to the
    dead-letter queue (so do undecodable or invalid payloads, always).

    Every value is checked here: a wrong one raises TypeError / ValueError naming
    it. The delays are computed without ever raising the multiplier to a power that
    overflows, in O(1) per attempt, whatever `max_attempts` is.
    """

    max_attempts: int = 1
    initial_interval: float = 1.0
    multiplier: float = 2.0  # DEFAULT_MULTIPLIER
    max_interval: float = 30.0
    jitter: float = 0.0
    strategy: RetryStrategy = RetryStrategy.BROKER
    retry_on: tuple[type[BaseException], ...] = (Exception,)
    fatal: tuple[type[BaseException], ...] = ()
    _tiers: tuple[int, ...] = field(init=False, repr=False, compare=False, default=())

    def __post_init__(self) -> None:
        C.integer("Retry.max_attempts", self.max_attempts, 1, MAX_ATTEMPT_HEADER)
        top = C.MAX_DELAY_SECONDS
        set_ = object.__setattr__
        set_(
            self,
            "initial_interval",
            C.number("Retry.initial_interval", self.initial_interval, 0, top),
        )
        set_(self, "max_interval", C.number("Retry.max_interval", self.max_interval, 0, top))
        set_(self, "multiplier", C.number("Retry.multiplier", self.multiplier, 1, 1e6))
        jitter = C.number("Retry.jitter", self.jitter, 0, 1)
        if jitter >= 1:
            raise ValueError(f"Retry.jitter must be >= 0 and < 1, got {self.jitter!r}")
        set_(self, "jitter", jitter)
        set_(self, "strategy", C.enum("Retry.strategy", RetryStrategy, self.strategy))
        if self.strategy is RetryStrategy.QUORUM_DELAYED:
            self._check_linear()
        set_(self, "retry_on", C.exception_types("Retry.retry_on", self.retry_on))
        set_(self, "fatal", C.exception_types("Retry.fatal", self.fatal))
        tiers = self._walk_tiers(MAX_DELAY_TIERS + 1)
        if (
            self.strategy is RetryStrategy.BROKER
            and self.max_attempts > 1
            and len(tiers) > MAX_DELAY_TIERS
        ):
            raise ValueError(
                f"Retry(max_attempts={self.max_attempts}, initial_interval="
                f"{self.initial_interval:g}, multiplier={self.multiplier:g}, max_interval="
                f"{self.max_interval:g}) has more than {MAX_DELAY_TIERS} distinct delays: "
                "each is a delay queue on the broker. Use a larger multiplier, a smaller "
                "max_attempts or RetryStrategy.IN_PROCESS"
            )
        set_(self, "_tiers", tiers)

    def _check_linear(self) -> None:
        """RetryStrategy.QUORUM_DELAYED: the broker's delay is linear and exact."""
        if self.multiplier != DEFAULT_MULTIPLIER:
            raise ValueError(
                f"Retry.multiplier={self.multiplier:g} does not apply to "
                "RetryStrategy.QUORUM_DELAYED: the quorum queue's delay grows linearly "
                "(initial_interval * n, up to max_interval); leave multiplier unset"
            )
        if self.jitter:
            raise ValueError(
                "Retry.jitter does not apply to RetryStrategy.QUORUM_DELAYED: the quorum "
                "queue computes the delay; leave jitter at 0"
            )
        if self.initial_interval <= 0 or self.max_interval < self.initial_interval:
            raise ValueError(
                "RetryStrategy.QUORUM_DELAYED needs 0 < initial_interval <= max_interval, got "
                f"{self.initial_interval:g} and {self.max_interval:g}"
            )

    def quorum_delay_arguments(self) -> dict[str, object]:
        """The queue arguments that make a RabbitMQ 4.3 quorum queue hold each delivery
        rejected with requeue for min(initial_interval * delivery_count, max_interval)."""
        return {
            "x-delayed-retry-type": "failed",
            "x-delayed-retry-min": _ms(self.initial_interval),
            "x-delayed-retry-max": _ms(self.max_interval),
        }

    # -- delays: O(1) per attempt, never an overflowing power -----------------

    def _raw(self, e: int) -> float:
        """initial_interval * multiplier**e, uncapped (inf when it overflows)."""
        try:
            return float(self.initial_interval * self.multiplier**e)
        except OverflowError:
            return math.inf

    def _at(self, e: int) -> float:
        return min(self._raw(e), self.max_interval)

    def _cap_exponent(self) -> int | None:
        """The smallest exponent whose delay is max_interval, None if none ever is."""
        if self.initial_interval >= self.max_interval:
            return 0
        if self.initial_interval == 0 or self.multiplier == 1:
            return None
        step = math.log1p(self.multiplier - 1)
        est = (math.log(self.max_interval) - math.log(self.initial_interval)) / step
        if not math.isfinite(est):  # pragma: no cover - a step below float precision
            est = 2.0**64
        lo, hi = 0, max(1, math.ceil(est) + 2)
        while self._raw(hi) < self.max_interval:  # float error: widen
            lo, hi = hi, hi * 2
        while lo < hi:  # smallest e in [lo, hi] with raw(e) >= max_interval
            mid = (lo + hi) // 2
            if self._raw(mid) >= self.max_interval:
                hi = mid
            else:
                lo = mid + 1
        return lo

    def _walk_tiers(self, limit: int) -> tuple[int, ...]:
        """Distinct delays (ms) of the broker retries, ascending, at most `limit` of them;
        O(tiers * log(max_attempts)) by binary search for where each tier ends."""
        n = self.max_attempts - 1  # failed attempts that are followed by a retry
        if n < 1:
            return ()
        cap = self._cap_exponent()
        last = n - 1 if cap is None else min(cap, n - 1)
        tiers: list[int] = []
        e = 0
        while len(tiers) < limit:
            ms = _ms(self._at(e))
            tiers.append(ms)
            if e >= last or ms >= _ms(self._at(last)):
                break
            lo, hi = e + 1, last  # smallest e' in (e, last] with a larger tier
            while lo < hi:
                mid = (lo + hi) // 2
                if _ms(self._at(mid)) > ms:
                    hi = mid
                else:
                    lo = mid + 1
            e = lo
        return tuple(tiers)

    def delay(self, attempt: int) -> float:
        """Seconds to wait after failed attempt `attempt` (1-based), before jitter."""
        if self.strategy is RetryStrategy.QUORUM_DELAYED:  # the broker's linear delay
            return min(self.initial_interval * max(attempt, 1), self.max_interval)
        return self._at(max(attempt - 1, 0))

    def jittered(self, attempt: int, rnd: random.Random | None = None) -> float:
        """The delay before retrying after `attempt`, with this policy's jitter applied."""
        d = self.delay(attempt)
        if self.jitter and d:
            r = (rnd or random).uniform(-self.jitter, self.jitter)
            d = d * (1 + r)
        return d

    def delay_tiers_ms(self) -> list[int]:
        """Every delay (ms) a broker retry can use: one TTL queue per tier."""
        return list(self._tiers)

    def tier_for(self, attempt: int) -> int:
        """The delay (ms) of the broker delay queue a retry after `attempt` goes to."""
        return _ms(self.delay(attempt))

    def total_delay(self) -> float:
        """The sum of the delays of all retries (before jitter), in O(1)."""
        n = self.max_attempts - 1
        if n < 1 or self.initial_interval == 0:
            return 0.0
        if self.strategy is RetryStrategy.QUORUM_DELAYED:  # linear up to the cap
            below = min(n, int(self.max_interval // self.initial_interval))
            return self.initial_interval * below * (below + 1) / 2 + (n - below) * self.max_interval
        cap = self._cap_exponent()
        if cap is None:  # multiplier 1 and below the cap: a constant delay
            return n * self.initial_interval
        j = min(cap, n)  # uncapped terms: initial * (m^j - 1) / (m - 1)
        m = self.multiplier
        if j <= 64:  # exact sums for every ordinary policy
            head = sum(self._raw(e) for e in range(j))
        else:  # here m > 1: the cap is reached
            head = self.initial_interval * math.expm1(j * math.log1p(m - 1)) / (m - 1)
        return head + (n - j) * self.max_interval

    def should_retry(self, exc: BaseException) -> bool:
        """Whether `exc` is retried: one of `retry_on` and none of `fatal`."""
        if self.fatal and isinstance(exc, self.fatal):
            return False
        return isinstance(exc, self.retry_on)


DEFAULT_MULTIPLIER = 2.0

MAX_DELAY_TIERS = 100
"""Most distinct broker retry delays (each one is a delay queue)."""

NO_RETRY = Retry(max_attempts=1)


def _ms(seconds: float) -> int:
    return max(math.ceil(seconds * 1000), 1)
