"""Header names ackkit writes, and reading the attempt number of a delivery."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

PREFIX = "ackkit-"
ATTEMPT = "ackkit-attempt"
"""Attempt number of the delivery this copy starts with (1-based). Our own header:
RabbitMQ 4 ignores client-set x-death, and x- names are the broker's."""
REASON = "ackkit-reason"
ERROR_TYPE = "ackkit-error-type"
ERROR_MESSAGE = "ackkit-error-message"
ERROR_TRACEBACK = "ackkit-error-traceback"
ATTEMPTS = "ackkit-attempts"
ORIGINAL_EXCHANGE = "ackkit-original-exchange"
ORIGINAL_ROUTING_KEY = "ackkit-original-routing-key"
ORIGINAL_QUEUE = "ackkit-original-queue"
LISTENER = "ackkit-listener"
FIRST_FAILURE = "ackkit-first-failure"
LAST_FAILURE = "ackkit-last-failure"
DEAD_LETTERED_AT = "ackkit-dead-lettered-at"
REPLAYED = "ackkit-replayed"
"""How often this message was replayed from a dead-letter queue (set by the DLQ tool)."""
REPLAYED_AT = "ackkit-replayed-at"

X_DELIVERY_COUNT = "x-delivery-count"
MAX_ATTEMPT_HEADER = 1_000_000


class BadAttemptHeader(ValueError):
    """The ackkit-attempt header is not a sane positive integer."""


def _as_int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, (bytes, str)):
        text = value.decode("ascii", "replace") if isinstance(value, bytes) else value
        text = text.strip()
        if text.isdigit() and len(text) <= 9:
            return int(text)
    return None


def counts_deliveries(headers: Mapping[str, Any] | None) -> bool:
    """True when the broker counts this copy's deliveries (a quorum queue's x-delivery-count)."""
    return headers is not None and X_DELIVERY_COUNT in headers


def attempt_of(headers: Mapping[str, Any] | None, redelivered: bool) -> int:
    """The 1-based attempt number of a delivery.

    ackkit's own header says which attempt this copy started at. On top of it,
    previous deliveries of this same copy count: quorum queues say how many
    (x-delivery-count); elsewhere the redelivered flag says "at least one".
    Raises BadAttemptHeader for a forged or garbage header.
    """
    base = 1
    extra = 1 if redelivered else 0
    if headers:
        raw = headers.get(ATTEMPT)
        if raw is not None:
            n = _as_int(raw)
            if n is None or not 1 <= n <= MAX_ATTEMPT_HEADER:
                raise BadAttemptHeader(f"invalid {ATTEMPT} header: {raw!r:.80}")
            base = n
        count = headers.get(X_DELIVERY_COUNT)
        if count is not None:
            c = _as_int(count)
            if c is not None and c >= 0:
                extra = c
    return base + extra
