"""Header names ackkit writes, and reading the attempt number of a delivery."""

from __future__ import annotations

import datetime as _dt
import decimal
import struct
from collections.abc import Mapping
from typing import Any

from .wire import Field

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

LOST = "ackkit-lost"
"""How many handler runs of this message were lost (its consumer died or disconnected
while the handler ran), counted on a copy made just before each run of a redelivery."""
LOST_BOUND = 3
"""A redelivery whose message already lost this many handler runs is dead-lettered
(with max_attempts=1; more attempts bound it sooner): at most 1 + LOST_BOUND runs."""

X_DELIVERY_COUNT = "x-delivery-count"
X_ACQUIRED_COUNT = "x-acquired-count"
MAX_ATTEMPT_HEADER = 1_000_000


class BadAttemptHeader(ValueError):
    """The ackkit-attempt header is not a sane positive integer."""


_INTEGER_FIELDS = {
    "b": ">b", "B": ">B", "s": ">h", "U": ">h", "u": ">H",
    "I": ">i", "i": ">I", "l": ">q", "L": ">q",
}  # fmt: skip
"""The AMQP field types that carry an integer, and how each is packed."""


_MISSING: Any = object()
ATTEMPT_CEILING = 2 * MAX_ATTEMPT_HEADER
"""Where a counted attempt number saturates: past every max_attempts, and far from
what a header can carry (a broker count of 2**63-1 plus one is still this)."""


def attempt_value(raw: Any) -> int:
    """The attempt number an ackkit-attempt header value says: one rule for every runtime.

    Only an AMQP integer field (any width, signed or not) from 1 to
    MAX_ATTEMPT_HEADER is an attempt number; ackkit writes nothing else there. Every
    other field type is forged, whatever it holds: a double 2.5 or 3.0 (pika would
    have read it as an int), a decimal, a bool, a digit string, void, a table. `raw`
    is either the value as it was on the wire (`wire.Field`, which the pika runtime
    keeps: pika decodes a float or a double as an int) or a value a client library
    decoded (aio-pika's pamqp keeps the type: an int is an integer field). Raises
    BadAttemptHeader otherwise, saying the same for the same field on every runtime.
    """
    if isinstance(raw, Field):
        n, kind = _field_value(raw), _FIELD_KINDS.get(raw.kind, f"type {raw.kind!r}")
    else:
        n, kind = raw, _KINDS.get(type(raw), type(raw).__name__)
        if type(n) is bytes:  # a long string that is not UTF-8 (both libraries)
            n = n.decode("utf-8", "replace")
    if type(n) is int and 1 <= n <= MAX_ATTEMPT_HEADER:
        return n
    shown = ""
    if type(n) in (int, float, bool) or (type(n) is str and len(n.encode()) <= 80):
        shown = f" {n!r}"
    raise BadAttemptHeader(f"invalid {ATTEMPT} header: {kind}{shown}")


_FIELD_KINDS = {
    **dict.fromkeys(_INTEGER_FIELDS, "integer"),
    "f": "floating-point number",
    "d": "floating-point number",
    "D": "decimal",
    "t": "boolean",
    "S": "string",
    "x": "byte array",
    "T": "timestamp",
    "F": "table",
    "A": "array",
    "V": "void",
}
"""What each AMQP field type is called in a forged attempt header's reason."""

_KINDS: dict[type, str] = {
    int: "integer",
    float: "floating-point number",
    bool: "boolean",
    str: "string",
    bytes: "string",
    bytearray: "byte array",
    type(None): "void",
    dict: "table",
    list: "array",
    decimal.Decimal: "decimal",
    _dt.datetime: "timestamp",
}
"""The same names for the values a client library decoded (by Python type)."""


def _field_value(f: Field) -> Any:
    """A wire field's value, for the types the attempt rule tells apart (else _MISSING)."""
    kind, raw = f.kind, f.raw
    fmt = _INTEGER_FIELDS.get(kind) or {"d": ">d", "f": ">f", "t": ">?"}.get(kind)
    if fmt is not None and len(raw) == 1 + struct.calcsize(fmt):
        return struct.unpack_from(fmt, raw, 1)[0]
    if kind == "S" and len(raw) <= 85:
        return raw[5:].decode("utf-8", "replace")
    return _MISSING


def lost_of(headers: Mapping[str, Any] | None, wire: Mapping[str, Any] | None = None) -> int:
    """The ackkit-lost count of a delivery: an integer field from 0 up (saturating at
    LOST_BOUND); anything else counts as 0 (the bound still holds after that many more)."""
    if not headers:
        return 0
    raw = (wire if wire is not None else headers).get(LOST)
    n = _field_value(raw) if isinstance(raw, Field) else raw
    return min(n, LOST_BOUND) if type(n) is int and n > 0 else 0


def _as_int(value: Any) -> int | None:
    """A broker count header (x-delivery-count, x-acquired-count) as an int, if it is one."""
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
    wire: Mapping[str, Any] | None = None,
    count: int | None = None,
) -> int:
    """The 1-based attempt number of a delivery.

    ackkit's own header says which attempt this copy started at (`attempt_value`;
    read from `wire`, the headers as they were on the wire, when the runtime kept
    them). On top of it,
    previous deliveries of this same copy count: the broker's count in
    `count_header` (x-delivery-count, or 4.3's x-acquired-count; which one is
    `BrokerTraits.count_source`'s decision), read only on a redelivery: a first
    delivery has no previous one, whatever a publisher wrote there (RabbitMQ 4.3
    passes a publisher's value through until it increments the count itself).
    Elsewhere the redelivered flag says "at least one". `returned`: deliveries of
    this copy that ackkit itself gave back unstarted (a paused listener, a tripped
    breaker), not counted. `count`: the protocol's own count of previous deliveries
    (AMQP 1.0's header delivery-count), taken as it is instead of the above: such a
    broker never counts a return ackkit made unstarted (`released`). The result
    saturates at ATTEMPT_CEILING. Raises BadAttemptHeader for a forged or garbage
    ackkit-attempt header.
    """
    base = 1
    extra = 1 if redelivered else 0
    if count is not None:
        if headers:
            raw = (wire if wire is not None else headers).get(ATTEMPT, _MISSING)
            if raw is not _MISSING:
                base = attempt_value(raw)
        return min(base + max(count, 0), ATTEMPT_CEILING)
    if headers:
        raw = (wire if wire is not None else headers).get(ATTEMPT, _MISSING)
        if raw is not _MISSING:
            base = attempt_value(raw)
        count = headers.get(count_header) if count_header and redelivered else None
        if count is not None:
            c = _as_int(count)
            if c is not None and c >= 0:
                extra = max(c, extra)  # a redelivery counts at least once, whatever it says
    return min(base + max(extra - returned, 0), ATTEMPT_CEILING)


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
