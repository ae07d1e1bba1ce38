"""Admission control and Trigger.AvailableNow runs of a batch-at-a-time consumer.

Two decisions of the Spark queue source, kept free of I/O so they are tested
without a broker or Spark:

* `admit`: how many of the deliveries waiting (in arrival order) the next batch
  takes, given a cap in messages and an optional cap in body bytes. A batch always
  takes at least one delivery when one waits (a single message larger than the
  byte cap still goes through, alone), never more than the message cap, and stops
  before the delivery that would take it past the byte cap.

* `AvailableNowRun`: which deliveries belong to a Trigger.AvailableNow run. When
  the run starts, the queue's depth (the message count of a passive queue.declare,
  ready messages only) is recorded on the consuming channel *before* basic.consume
  is sent on it, so no delivery is in flight: the first `depth` deliveries on that
  channel (delivery tags 1..depth) are exactly the messages that were in the queue
  at that moment (a queue hands its messages out in order; a message published
  later is behind all of them). Deliveries past that belong to the next run: they
  are never handed out and go back to the queue unacked when the run ends.

  A channel lost before consuming began on it: the depth is taken again on the
  next channel (nothing was delivered). A channel lost after: the run ends with
  the batches it handed out (the broker requeued the rest, in front of messages
  published since, so their count can no longer be told apart); the next run reads
  the rest. The run is complete once every counted delivery arrived and none of
  them waits to be handed out, or the counted deliveries stopped arriving for
  `stall` seconds (expired by a TTL, purged, or taken by another consumer).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Limits:
    """The per-batch caps of a source (Spark's admission control)."""

    max_messages: int
    """At most this many deliveries per batch (option maxMessagesPerTrigger)."""
    max_bytes: int | None = None
    """At most this many body bytes per batch, unless one delivery alone is larger
    (option maxBytesPerTrigger); None: no byte cap."""

    def __post_init__(self) -> None:
        if self.max_messages < 1:
            raise ValueError(f"max_messages must be >= 1, got {self.max_messages}")
        if self.max_bytes is not None and self.max_bytes < 1:
            raise ValueError(f"max_bytes must be >= 1, got {self.max_bytes}")


def admit(sizes: Iterable[int], limits: Limits) -> int:
    """How many of the waiting deliveries (their body sizes, oldest first) the next batch
    takes: the longest prefix within both caps, and at least one if any waits."""
    n = total = 0
    cap = limits.max_bytes
    for size in sizes:
        if n >= limits.max_messages:
            break
        if cap is not None and n > 0 and total + size > cap:
            break
        n += 1
        total += size
    return n


class AvailableNowRun:
    """The deliveries of one Trigger.AvailableNow run (see the module doc).

    Facts come from the runtime (`counted`, `consuming`, `channel_lost`, and the
    delivery counts it passes in); the answers (`needs_count`, `eligible`, `complete`)
    are decisions it carries out."""

    def __init__(self, stall: float = 60.0) -> None:
        self.stall = stall
        self.generation: int | None = None
        """The channel whose deliveries are counted (None: not counted yet)."""
        self.depth = 0
        """Messages in the queue when counted: deliveries 1..depth of that channel."""
        self.base = 0
        """The runtime's delivery count when counted (deliveries since = count - base)."""
        self.started = False
        """Consuming began on the counted channel (a loss then ends the run)."""
        self.ended: str | None = None
        """Why the run ended early (None while it runs or once it completed normally)."""
        self._progress = (0, 0.0)

    # -- facts ---------------------------------------------------------------------

    def counted(self, generation: int, received: int, depth: int, now: float) -> None:
        """The passive declare on channel `generation` answered `depth`; the runtime had
        received `received` deliveries in all (none on that channel yet)."""
        if depth < 0:
            raise ValueError(f"a queue depth is not negative, got {depth}")
        self.generation, self.depth, self.base = generation, depth, received
        self.started = False
        self._progress = (0, now)

    def consuming(self, generation: int) -> None:
        """basic.consume-ok on channel `generation`."""
        if generation == self.generation:
            self.started = True

    def channel_lost(self, generation: int) -> None:
        """Channel `generation` closed (the broker requeued what it had delivered)."""
        if generation == self.generation and self.started and self.ended is None:
            self.ended = "the connection to the broker was lost during the run"

    # -- decisions -----------------------------------------------------------------

    def needs_count(self, generation: int) -> bool:
        """Should the queue be counted on channel `generation` before consuming on it?"""
        return self.generation is None or (self.generation != generation and not self.started)

    def eligible(self, generation: int, tag: int) -> bool:
        """Does delivery `tag` of channel `generation` belong to this run?"""
        return self.ended is None and self.generation == generation and 1 <= tag <= self.depth

    def arrived(self, received: int) -> int:
        """Counted deliveries that arrived, given the runtime's delivery count."""
        return min(max(received - self.base, 0), self.depth)

    def complete(self, received: int, waiting: int, now: float) -> bool:
        """Is the run over? `waiting`: counted deliveries not yet handed out.

        True once every counted delivery arrived and none waits, when the run ended early
        (a lost channel), or when none arrived for `stall` seconds while some were still
        due (it then records why in `ended`)."""
        if self.generation is None:
            return False
        if self.ended is not None:
            return waiting == 0
        got = self.arrived(received)
        if got >= self.depth:
            return waiting == 0
        seen, since = self._progress
        if got != seen:
            self._progress = (got, now)
        elif waiting == 0 and now - since >= self.stall:
            self.ended = (
                f"{self.depth - got} of the {self.depth} messages counted at the start did "
                f"not arrive within {self.stall:.0f} s (expired, purged, or taken by another "
                "consumer?)"
            )
            return True
        return False
