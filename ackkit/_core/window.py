"""Outstanding delivery tags of one channel generation, and the contiguous settled prefix.

Delivery tags are positive integers that grow by one per delivery on a
channel, from 1. The window keeps one state per tag from the oldest outstanding
tag on, so the contiguous settled prefix is a pop from the left: a
`basic.ack(multiple=True)` may cover it and nothing else.

A window of a channel it shares with others (`shared=True`: pull mode gets from
several queues on one channel, each queue with its own core) treats a tag it
never saw (a gap, or tags before the first one it saw) as someone else's: it
may still be outstanding and is not ours to settle, so no multiple frame may
cover it. `foreign` is the lowest such tag; a multiple frame reaching it is
never built (the deliveries it would cover are acked one frame each instead).
A window that is alone on its channel treats a gap as tags consumed without
ack (nothing outstanding), which a multiple frame may cover.
"""

from __future__ import annotations

import sys
from collections import deque

IN_FLIGHT = 0  # delivered, not yet settled
ACK_PENDING = 1  # settled as ack, ack not sent yet
GONE = 2  # no longer outstanding at the broker (rejected/nacked/acked individually)


class TagWindow:
    """Tag states from `base` upwards; `pending` counts ACK_PENDING tags."""

    __slots__ = ("_states", "base", "foreign", "last", "pending", "shared")

    def __init__(self, shared: bool = False) -> None:
        self._states: deque[int] = deque()
        self.base = 0
        self.pending = 0
        self.shared = shared
        self.last = 0  # shared: the newest tag seen
        self.foreign = sys.maxsize  # shared: the lowest tag of this channel delivered elsewhere

    def may_cover(self, tag: int) -> bool:
        """May a multiple frame up to `tag` go out (it covers no tag delivered elsewhere)?"""
        return tag < self.foreign

    def __len__(self) -> int:
        return len(self._states)

    def add(self, tag: int) -> None:
        """Track a newly delivered tag (tags on a channel only grow)."""
        if self.shared:
            last = self.last
            if tag > last + 1:
                # Tags last+1 .. tag-1 went elsewhere on this channel (another queue's get):
                # maybe still outstanding, never ours to settle, never under a multiple frame.
                self.foreign = min(self.foreign, last + 1)
            self.last = max(last, tag)
        states = self._states
        if not states:
            self.base = tag
            states.append(IN_FLIGHT)
            return
        nxt = self.base + len(states)
        if tag < nxt:
            raise ValueError(f"delivery tag {tag} is not newer than {nxt - 1}")
        # Inside the window a gap holds GONE: nothing of ours to settle there (whether
        # a multiple frame may cover it is `foreign`'s business).
        states.extend([GONE] * (tag - nxt))
        states.append(IN_FLIGHT)

    def state(self, tag: int) -> int:
        i = tag - self.base
        if 0 <= i < len(self._states):
            return self._states[i]
        return GONE

    def mark_ack(self, tag: int) -> None:
        i = tag - self.base
        if not 0 <= i < len(self._states) or self._states[i] != IN_FLIGHT:
            raise ValueError(f"delivery tag {tag} is not in flight")
        self._states[i] = ACK_PENDING
        self.pending += 1

    def mark_gone(self, tag: int) -> None:
        i = tag - self.base
        if 0 <= i < len(self._states):
            if self._states[i] == ACK_PENDING:
                self.pending -= 1
            self._states[i] = GONE
            self._trim()

    def mark_gone_upto(self, tag: int) -> list[int]:
        """Everything <= tag leaves (a multiple nack went out). Returns tags that were in flight."""
        was_in_flight: list[int] = []
        states = self._states
        while states and self.base <= tag:
            s = states.popleft()
            if s == IN_FLIGHT:
                was_in_flight.append(self.base)
            elif s == ACK_PENDING:
                self.pending -= 1
            self.base += 1
        return was_in_flight

    def in_flight_upto(self, tag: int) -> list[int]:
        end = min(tag - self.base + 1, len(self._states))
        return [self.base + i for i in range(end) if self._states[i] == IN_FLIGHT]

    def take_prefix(self) -> tuple[int, int]:
        """Pop the contiguous settled prefix. Returns (highest ack-pending tag, count) or (0, 0).

        `Ack(top, multiple=count > 1)` settles it. It stops before a second ack-pending
        tag at or past `foreign`: what is left stays pending (see take_stragglers).
        """
        states = self._states
        top = 0
        n = 0
        if self.foreign == sys.maxsize:  # every tag of the channel up to here is ours
            while states and states[0] != IN_FLIGHT:
                if states.popleft() == ACK_PENDING:
                    top = self.base
                    n += 1
                self.base += 1
        else:
            while states and states[0] != IN_FLIGHT:
                if states[0] == ACK_PENDING:
                    if n and self.base >= self.foreign:
                        break  # a multiple frame up to here would cover a tag not ours
                    top = self.base
                    n += 1
                states.popleft()
                self.base += 1
        self.pending -= n
        return top, n

    def take_stragglers(self) -> list[int]:
        """Ack-pending tags behind an in-flight head: they can only be acked one by one."""
        if not self.pending:
            return []
        states = self._states
        out = []
        for i, s in enumerate(states):
            if s == ACK_PENDING:
                states[i] = GONE
                out.append(self.base + i)
        self.pending = 0
        return out

    def in_flight(self) -> list[int]:
        return [self.base + i for i, s in enumerate(self._states) if s == IN_FLIGHT]

    def _trim(self) -> None:
        states = self._states
        while states and states[0] == GONE:
            states.popleft()
            self.base += 1
