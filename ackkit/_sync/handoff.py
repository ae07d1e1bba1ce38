"""Deliveries on their way from the I/O thread to a listener's handler threads.

pika hands the I/O thread the deliveries of one socket read one by one. Handed on one
by one, each wakes a waiting handler thread, which then runs beside the I/O thread
for every delivery (the GIL passing to and fro, a thread switch or more each). With
one handler thread, the deliveries of one read are gathered into a burst (`arrive`)
and handed over together once the I/O loop has dealt with the read (a `call_later(0)`
callback runs after the read's frames): one wake-up per burst. With several handler
threads each delivery is handed over at once, so that they share the work.

What waits here is the listener's unstarted work: a stop takes all of it back
(`drain`), the burst not yet handed over included, and returns it to the broker.
"""

from __future__ import annotations

import queue
import threading
from collections import deque
from collections.abc import Callable
from typing import Generic, TypeVar

D = TypeVar("D")


class Handoff(Generic[D]):
    """The deliveries no handler thread has taken yet, oldest first."""

    __slots__ = ("_burst", "_later", "_lock", "_ready", "_wake", "per_burst")

    def __init__(self, lock: threading.Lock, per_burst: bool) -> None:
        self._lock = lock  # the listener's: `arrive` and `drain` run under it
        self.per_burst = per_burst
        self._ready: deque[D] = deque()  # handed over, not taken
        self._burst: list[D] = []  # I/O thread: this read's, not handed over yet
        self._wake: queue.SimpleQueue[bool] = queue.SimpleQueue()  # True: look; False: leave

    # -- the I/O thread -------------------------------------------------------------

    def arrive(self, d: D, later: Callable[[Callable[[], None]], object]) -> None:
        """Holding the lock, on the I/O thread: `d` came off the socket. `later(fn)` runs
        `fn` on the I/O thread once the current read is dealt with."""
        if not self.per_burst:
            self.put(d)
            return
        burst = self._burst
        burst.append(d)
        if len(burst) == 1:
            later(self.hand_over)

    def hand_over(self) -> None:
        """I/O thread: the burst goes to the handler thread (also called when the channel
        closes, so a burst whose `later` never runs is not left behind)."""
        with self._lock:
            burst, self._burst = self._burst, []
        if burst:
            self._ready.extend(burst)
            self._wake.put(True)

    # -- any thread -----------------------------------------------------------------

    def put(self, d: D) -> None:
        """`d` goes to a handler thread now."""
        self._ready.append(d)
        self._wake.put(True)

    def put_back(self, ds: list[D]) -> None:
        """What `drain` took and may still start, back in its order, ahead of the rest."""
        self._ready.extendleft(reversed(ds))
        for _ in ds:
            self._wake.put(True)

    def drain(self) -> list[D]:
        """Take every delivery no handler thread has taken, the burst not yet handed over
        too (the caller holds no lock)."""
        with self._lock:
            burst, self._burst = self._burst, []
        ready = self._ready
        out: list[D] = []
        while True:
            try:
                out.append(ready.popleft())
            except IndexError:
                break
        return out + burst

    def empty(self) -> bool:
        """Nothing waits for a handler thread (nor for its hand-over)."""
        return not self._ready and not self._burst

    def close(self, threads: int) -> None:
        """Each of `threads` handler threads leaves once nothing is ready for it."""
        for _ in range(threads):
            self._wake.put(False)

    # -- a handler thread -----------------------------------------------------------

    def take(self, timeout: float | None = None) -> D | None:
        """The oldest ready delivery, waiting for one; None: leave (`close`). Raises
        `queue.Empty` after `timeout` seconds without one."""
        ready = self._ready
        while True:
            try:
                return ready.popleft()
            except IndexError:
                pass
            if not self._wake.get(timeout=timeout):
                return None

    def leave_again(self) -> None:
        """A thread that took its leave (`take` returned None) but must finish first
        hands the leave back for later."""
        self._wake.put(False)
