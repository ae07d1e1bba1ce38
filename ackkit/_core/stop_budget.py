"""How long each step of a graceful stop may wait: one budget, `shutdown_timeout` (no I/O).

A stop cancels the consumers, lets running handlers finish, waits for the
broker to confirm the copies published for them (dead letters, retries), lets
an outbox relay end the batch it is sending, then closes the connection (the
phases of `ackkit._interpreter.stopping`, which asks each one's share here). A
broker that blocks publishers (a memory or disk alarm) answers none of these:
each step waiting its own fixed time made `stop()` take shutdown_timeout + 5 +
5 + 10 s. Every step now takes its wait out of the one deadline, with a small
floor so the acks of finished work still get a chance, and the connection close
gets `CLOSE_GRACE` before it is dropped: `stop()` returns within
`shutdown_timeout + MAX_OVERRUN` seconds. An original whose copy was not
confirmed in time is not acked: the broker redelivers it.

One wait may run past the confirms' share: copies already sent when it ends.
Closing the channel then would leave a copy the broker did route next to its
original requeued by the close (the message twice), so the stop waits up to
`COPY_GRACE` more for their confirms (`may_close`); a broker that answers
nothing meanwhile costs those seconds, never a second copy of a message it did
answer for.
"""

from __future__ import annotations

import time
from collections.abc import Callable

CANCEL_WAIT = 5.0
"""Most seconds a stop waits for the broker to confirm a consumer's cancel."""
CONFIRM_WAIT = 5.0
"""Most seconds a stop waits for the copies' publisher confirms (after the handlers)."""
RELAY_WAIT = 5.0
"""Most seconds a stop waits for the outbox relay to end the batch it is sending."""
CLOSE_GRACE = 2.0
"""Seconds the connection close may wait for the broker's close-ok before it is dropped."""
COPY_GRACE = 3.0
"""Most seconds past the confirms' wait a stop still waits for copies already sent."""
CANCEL_FLOOR = 0.2
CONFIRM_FLOOR = 0.5
MAX_OVERRUN = CANCEL_FLOOR + CONFIRM_FLOOR + COPY_GRACE + CLOSE_GRACE
"""Most seconds a stop may take beyond `shutdown_timeout`."""


def may_close(quiescent: bool, in_flight: bool, now: float, deadline: float) -> bool:
    """May a stop close the connection at `now`, its confirms' wait ending at `deadline`?
    Once nothing is awaited (`quiescent`); at the deadline unless copies are still in
    flight (sent, their confirm or their original's ack not yet through); at the latest
    `COPY_GRACE` seconds after it."""
    if quiescent:
        return True
    if now <= deadline:
        return False
    return not in_flight or now > deadline + COPY_GRACE


class StopBudget:
    """The waits of one graceful stop, out of one deadline."""

    __slots__ = ("_clock", "deadline")

    def __init__(self, timeout: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self.deadline = clock() + max(timeout, 0.0)

    def left(self) -> float:
        """Seconds to the deadline (0 once it has passed)."""
        return max(self.deadline - self._clock(), 0.0)

    def cancel(self) -> float:
        """How long to wait for the consumers' cancel-ok."""
        return min(CANCEL_WAIT, max(self.left(), CANCEL_FLOOR))

    def handlers(self) -> float:
        """How long running handlers may still take."""
        return self.left()

    def confirms(self) -> float:
        """How long to wait for the copies' confirms and the last acks."""
        return min(CONFIRM_WAIT, max(self.left(), CONFIRM_FLOOR))

    def relay(self) -> float:
        """How long the outbox relay may take to end the batch it is sending (sent,
        confirmed, deleted) before the connection closes: what is left, no floor (past
        the deadline a batch is cut short, as a crash would)."""
        return min(RELAY_WAIT, self.left())

    @property
    def close(self) -> float:
        """How long the connection close may wait for close-ok."""
        return CLOSE_GRACE
