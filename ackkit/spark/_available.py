"""The source runner's consumer: consumes when Spark first asks, and runs Trigger.AvailableNow.

`RunnerConsumer` is the `SourceConsumer` of a source runner. It connects at once
but sends basic.consume only when Spark first asks for data: on the first
`read()` (any trigger), or, with Trigger.AvailableNow, when Spark calls
`prepareForTriggerAvailableNow()`. Then the queue is counted first (a passive
queue.declare on the consuming channel, answered before basic.consume is sent on
it, so no delivery is in flight) and the run hands out exactly the first `depth`
deliveries of that channel, in batches within maxMessagesPerTrigger and
maxBytesPerTrigger, then reports "no new data" so that Spark ends the query.
Which deliveries belong to the run, and when it is over, is the core's
`AvailableNowRun`; how many a batch takes is the core's `admit`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from ._consumer import SourceConsumer, SourceFailed
from ._core.admission import AvailableNowRun
from ._core.batches import BatchPlan
from ._rows import Item

log = logging.getLogger("ackkit.spark")

COUNT_PATIENCE = 120.0
"""Seconds `prepare_available_now` waits for the queue to be counted (the broker down)."""


class RunnerConsumer(SourceConsumer):
    """A `SourceConsumer` that consumes on demand and knows Trigger.AvailableNow runs."""

    def __init__(self, *args: Any, stall: float = 60.0, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.run: AvailableNowRun | None = None
        self._stall = stall
        self._open = False  # basic.consume may go out
        self._held: Any = None  # a channel set up (basic.qos done) and waiting to consume
        self._consuming_on: Any = None
        self._counted = threading.Event()
        self._told_end = False

    # -- the reader's thread ---------------------------------------------------------

    def consume_now(self) -> None:
        """Start consuming (Spark asked for data); a no-op once consuming."""
        if not self._open:
            self._open = True
            self.call_soon(self._kick)

    def prepare_available_now(self, patience: float = COUNT_PATIENCE) -> AvailableNowRun:
        """Count the queue, then consume: the run is the messages counted (Spark's
        prepareForTriggerAvailableNow). Raises SourceFailed when the broker does not answer
        within `patience` seconds."""
        with self.lock:
            if self.run is None:
                self.run = AvailableNowRun(self._stall)
        self.call_soon(self._kick)
        deadline = time.monotonic() + patience
        while not self._counted.wait(0.1):
            self._raise_fatal()
            if time.monotonic() > deadline:
                raise SourceFailed(
                    f"Trigger.AvailableNow: could not count the messages in queue "
                    f"{self.opts.queue!r} within {patience:.0f} s (is the broker reachable?)"
                )
        run = self.run
        log.info(
            "ackkit.spark: %r: Trigger.AvailableNow run of the %d messages in the queue now",
            self.opts.queue,
            run.depth,
        )
        return run

    def take(self, start: int, seal: Callable[[list[Item], BatchPlan], None]) -> BatchPlan:
        """A batch of the AvailableNow run (an empty plan once the run is over); without a
        run, the streaming `SourceConsumer.take`."""
        run = self.run
        if run is None:
            self.consume_now()
            return super().take(start, seal)
        wait = max(self.opts.linger, 0.01)
        with self.cond:
            self._waiting += 1
            try:
                seen = -1
                while True:
                    self._raise_fatal()
                    if self.stopping:
                        return BatchPlan(start, start, [], [])
                    if self._told_end:
                        break
                    n = self._eligible(run)
                    take = self._admit(n)
                    if n and (
                        take < n  # a cap is reached
                        or run.arrived(self.received) >= run.depth  # nothing more is due
                        or n == seen  # nothing came for `linger`: hand out what waits
                    ):
                        plan = self._hand_out(start, take, seal)
                        if plan.rows:
                            return plan
                        seen = -1  # only copies of rows handed out before: go on
                        continue
                    if run.complete(self.received, n, time.monotonic()):
                        self._tell_end(run)
                        break
                    seen = n
                    self.cond.wait(wait)
            finally:
                self._waiting -= 1
        # The run is over: the acks the core still holds (redelivered copies of rows that
        # an earlier run wrote, settled on arrival) go on the wire before Spark hears that
        # nothing is left, so a runner stopped right after cannot take them with it.
        self._send_held_acks()
        return BatchPlan(start, start, [], [])

    def _send_held_acks(self, timeout: float = 30.0) -> None:
        with self.lock:
            acts = self.core.drain()
            if acts:
                self.queue(acts)
        if acts:
            self.flushed(timeout)

    def _eligible(self, run: AvailableNowRun) -> int:
        """How many buffered deliveries, from the oldest, belong to the run."""
        n = 0
        for it in self.buffer:
            if not run.eligible(it.tracked.generation, it.tracked.tag):
                break
            n += 1
        return n

    def _tell_end(self, run: AvailableNowRun) -> None:
        if self._told_end:
            return
        self._told_end = True
        if run.ended is not None:
            log.warning(
                "ackkit.spark: %r: Trigger.AvailableNow run ends early: %s; the next run "
                "reads the rest",
                self.opts.queue,
                run.ended,
            )
        else:
            log.info("ackkit.spark: %r: Trigger.AvailableNow run complete", self.opts.queue)

    # -- the I/O thread ----------------------------------------------------------------

    def _kick(self) -> None:
        ch = self.channel
        if ch is not None and ch is self._held:
            self._held = None
            self._consume(ch)
        elif ch is not None and ch is self._consuming_on:
            run = self.run
            if run is not None and run.needs_count(self.core.generation):
                # Consuming began before Spark said AvailableNow (not expected): count now;
                # deliveries in flight at this moment are left for the next run.
                self._count(ch)

    def _consume(self, ch: Any) -> None:
        """After basic.qos on a new channel: count the queue first for an AvailableNow run,
        hold the channel until Spark asks for data, or consume."""
        if ch is not self.channel:
            return
        run = self.run
        if run is not None and run.needs_count(self.core.generation):
            self._count(ch)
        elif run is not None or not self._open:
            # Spark has not asked yet; or a new channel after the run's own was lost: the
            # run is over, and its redelivered messages are for the next run.
            self._held = ch
        else:
            self._consuming_on = ch
            super()._consume(ch)

    def _count(self, ch: Any) -> None:
        ch.queue_declare(self.opts.queue, passive=True, callback=lambda f: self._on_count(ch, f))

    def _on_count(self, ch: Any, frame: Any) -> None:
        if ch is not self.channel or self.run is None:
            return
        with self.lock:
            self.run.counted(
                self.core.generation,
                self.received,
                int(frame.method.message_count),
                time.monotonic(),
            )
            if ch is self._consuming_on:
                self.run.consuming(self.core.generation)
        self._open = True
        self._counted.set()
        if ch is not self._consuming_on:
            self._consuming_on = ch
            super()._consume(ch)

    def _on_consuming(self, frame: Any) -> None:
        super()._on_consuming(frame)
        if self.run is not None:
            with self.lock:
                self.run.consuming(self.core.generation)

    def _on_channel_closed(self, ch: Any, reason: BaseException) -> None:
        if ch is self.channel and self.run is not None:
            with self.lock:
                self.run.channel_lost(self.core.generation)
        if ch is self._held:
            self._held = None
        if ch is self._consuming_on:
            self._consuming_on = None
        super()._on_channel_closed(ch, reason)
        with self.cond:
            self.cond.notify_all()
