"""Outstanding delivery tags of one channel generation, and the contiguous settled prefix.

Delivery tags are positive integers that grow by one per delivery on a
channel. The window keeps one state per tag from the oldest outstanding tag
on, so the contiguous settled prefix is a pop from the left: a
`basic.ack(multiple=True)` may cover it and nothing else.
"""

from __future__ import annotations

from collections import deque

IN_FLIGHT = 0  # delivered, not yet settled
ACK_PENDING = 1  # settled as ack, ack not sent yet
GONE = 2  # no longer outstanding at the broker (rejected/nacked/acked individually)


class TagWindow:
    """Tag states from `base` upwards; `pending` counts ACK_PENDING tags."""

    __slots__ = ("_states", "base", "pending")

    def __init__(self) -> None:
        self._states: deque[int] = deque()
        self.base = 0
        self.pending = 0

    def __len__(self) -> int:
        return len(self._states)

    def add(self, tag: int) -> None:
        """Track a newly delivered tag (tags on a channel only grow)."""
        states = self._states
        if not states:
            self.base = tag
            states.append(IN_FLIGHT)
            return
        nxt = self.base + len(states)
        if tag < nxt:
            raise ValueError(f"delivery tag {tag} is not newer than {nxt - 1}")
        # A gap means tags consumed elsewhere on this channel (e.g. no-ack gets):
        # they are not outstanding, so they may be covered by a multiple ack.
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
        """Pop the contiguous settled prefix. Returns (highest ack-pending tag, count) or (0, 0)."""
        states = self._states
        top = 0
        n = 0
        while states and states[0] != IN_FLIGHT:
            if states.popleft() == ACK_PENDING:
                top = self.base
                n += 1
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
