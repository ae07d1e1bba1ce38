"""Tracked: the core's record of one delivery, from receive until it is settled."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .actions import Action, Reinvoke


class Tracked:
    """The core's record of one delivery. Runtimes hold it inside their Delivery; the core
    never holds a runtime object (runtimes map delivery tags to theirs)."""

    __slots__ = (
        "again",
        "attempt",
        "carry",
        "doomed",
        "exchange",
        "first_failure",
        "generation",
        "headers",
        "key",
        "lost",
        "lost_copies",
        "message_id",
        "parked",
        "routing_key",
        "settled",
        "tag",
        "verdict",
    )

    def __init__(
        self,
        tag: int,
        generation: int,
        attempt: int,
        headers: Mapping[str, Any] | None,
        exchange: str,
        routing_key: str,
        message_id: str | None = None,
    ) -> None:
        self.tag = tag
        self.generation = generation
        self.attempt = attempt
        self.headers = headers
        self.exchange = exchange
        self.routing_key = routing_key
        self.message_id = message_id
        self.key: object | None = None  # its serial key (`SerialKey.of`), with serial mode
        # Headers set on every copy republished for this delivery (retry, dead letter):
        # e.g. the trace context of the span that handled it.
        self.carry: Mapping[str, Any] | None = None
        self.settled = False
        self.parked = False
        self.verdict: list[Action] | None = None
        # `finish` decided an in-process retry (until `outcome.handled` takes it)
        self.again: Reinvoke | None = None
        self.first_failure: str | None = None  # in-process retries: when attempt 1 failed
        # A redelivery that may have been lost while its handler ran (max_attempts=1):
        # the handler runs on a copy counting one more lost run (`Shutdown.start`).
        self.lost: int | None = None
        self.lost_copies = 0  # copies of it sent again after their channel closed (republish)
        # An inbox listener's redelivery ackkit ends unrun unless its key is recorded (a
        # duplicate then): (the dead-letter reason, the attempts it reports); see
        # `LostRuns.look_up_first`.
        self.doomed: tuple[str, int | None] | None = None

    def __repr__(self) -> str:
        return f"Tracked(tag={self.tag}, gen={self.generation}, attempt={self.attempt})"
