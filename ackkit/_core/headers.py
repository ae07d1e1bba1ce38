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
ORIGINAL_EXPIRATION = "ackkit-original-expiration"
"""The per-message expiration the original carried (copies that drop it say what it was)."""
ORIGINAL_USER_ID = "ackkit-original-user-id"
"""The original's user_id, when it names another user than ackkit's connection (the
broker refuses a publish whose user_id is not the publishing user)."""
HEADERS_DROPPED = "ackkit-headers-dropped"
"""Encoded size in bytes of the original's headers, left off a copy that could not
carry them (too large for one frame, or not encodable)."""
COPY_NOTE = "ackkit-copy-note"
"""Why a copy differs from the original beyond the documented rules (shortened fields)."""

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


def broker_counts_deliveries(queue_type: str | None) -> bool:
    """Does the broker maintain x-delivery-count on this queue's deliveries?

    Only quorum queues do (RabbitMQ 3.8+; the broker overwrites whatever a
    publisher wrote there). On a classic queue or stream the header is whatever
    the producer put in it: trusting it would let a forged value freeze the
    attempt counter, so the redelivered flag counts instead. An unknown queue
    type is not trusted either: the redelivered flag then counts each loss once,
    and a redelivered copy is restamped (see ListenerCore.receive).
    """
    return queue_type == "quorum"


def attempt_of(
    headers: Mapping[str, Any] | None, redelivered: bool, *, trust_count: bool = False
) -> int:
    """The 1-based attempt number of a delivery.

    ackkit's own header says which attempt this copy started at. On top of it,
    previous deliveries of this same copy count: a quorum queue says how many
    (x-delivery-count, read only with `trust_count`); elsewhere the redelivered
    flag says "at least one". Raises BadAttemptHeader for a forged or garbage
    ackkit-attempt header.
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
        count = headers.get(X_DELIVERY_COUNT) if trust_count else None
        if count is not None:
            c = _as_int(count)
            if c is not None and c >= 0:
                extra = max(c, extra)  # a redelivery counts at least once, whatever it says
    return base + extra
