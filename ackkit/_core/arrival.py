"""What a delivery's arrival comes to, before any handler sees it: one pure rule.

`ListenerCore.receive` tracks the delivery, then asks `arrival()` whether the
handler may run, or what is done instead. The rule reads only facts about
the delivery and the listener, so it is tested as a table.
"""

from __future__ import annotations

from enum import Enum

from .brokers import CountSource
from .policy import AckMode


class Arrival(str, Enum):
    """The verdict on a delivery as it arrives."""

    RUN = "run"
    """Hand it to the handler."""
    UNREADABLE = "unreadable"
    """The client could not decode its properties: dead-lettered (or rejected)."""
    FORGED = "forged"
    """Its attempt header is not one ackkit or the broker wrote: dead-lettered."""
    EXHAUSTED = "exhausted"
    """Redelivered after a consumer loss with its attempts used up: dead-lettered, so a
    message that kills its consumer does not loop (Celery's reject_on_worker_lost)."""
    RESTAMP = "restamp"
    """Redelivered from a queue that does not count deliveries: a copy carrying its
    attempt number goes back to the queue instead (then the original is acked)."""


def arrival(
    *,
    mode: AckMode,
    unreadable: bool,
    forged: bool,
    attempt: int,
    max_attempts: int,
    redelivered: bool,
    count: CountSource,
) -> Arrival:
    """The verdict for a delivery: `attempt` as counted from its headers (or the
    redelivered flag), `forged` when its attempt header could not be trusted, `count`
    where this broker and queue type count deliveries."""
    if unreadable:
        return Arrival.UNREADABLE
    if mode is AckMode.NONE:
        return Arrival.RUN  # the broker forgot it on send: the handler is its only chance
    if forged:
        return Arrival.FORGED
    if max_attempts > 1 and attempt > max_attempts:
        return Arrival.EXHAUSTED
    if max_attempts > 1 and redelivered and count is CountSource.REDELIVERED:
        return Arrival.RESTAMP
    return Arrival.RUN
