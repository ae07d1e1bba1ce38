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
RESTAMP_ID = "ackkit-restamp-id"
"""Names one restamp copy: the consumer that published it holds the copy back, should it
arrive before the original's ack is out (a kill in between would leave both)."""

X_DELIVERY_COUNT = "x-delivery-count"
X_ACQUIRED_COUNT = "x-acquired-count"
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
        # ASCII digits only: str.isdigit() also takes "²" or "⑴", which int() refuses
        if text.isascii() and text.isdigit() and len(text) <= 9:
            return int(text)
    return None


def attempt_of(
    headers: Mapping[str, Any] | None,
    redelivered: bool,
    *,
    count_header: str | None = None,
    returned: int = 0,
) -> int:
    """The 1-based attempt number of a delivery.

    ackkit's own header says which attempt this copy started at. On top of it,
    previous deliveries of this same copy count: the broker's count in
    `count_header` (x-delivery-count, or 4.3's x-acquired-count; which one is
    `BrokerTraits.count_source`'s decision), read only on a redelivery: a first
    delivery has no previous one, whatever a publisher wrote there (RabbitMQ 4.3
    passes a publisher's value through until it increments the count itself).
    Elsewhere the redelivered flag says "at least one". `returned`: deliveries of
    this copy that ackkit itself gave back unstarted (a paused listener, a tripped
    breaker), not counted. Raises BadAttemptHeader for a forged or garbage
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
        count = headers.get(count_header) if count_header and redelivered else None
        if count is not None:
            c = _as_int(count)
            if c is not None and c >= 0:
                extra = max(c, extra)  # a redelivery counts at least once, whatever it says
    return base + max(extra - returned, 0)


COUNTER_MAX = 2**63 - 1
"""The largest count a header can carry (AMQP's signed 64-bit integer). A counter
ackkit increments stops there instead of growing past what the wire can encode."""


def next_count(count: int | None) -> int:
    """`count` plus one, saturating at COUNTER_MAX; None or a negative count starts at 1.

    Every counter ackkit carries forward from a header a producer could have written
    (ackkit-replayed) goes through here: a hostile 2**63-1 must not make the copy
    unencodable (and so the message unreplayable)."""
    if count is None or count < 0:
        return 1
    return min(count, COUNTER_MAX - 1) + 1
