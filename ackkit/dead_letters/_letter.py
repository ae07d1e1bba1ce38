"""What a dead letter says, read from headers of any shape; which copies a replay takes.

No I/O here (the DLQ tool in `_queue.py` does it with pika). Reading is total:
headers of any type (bytes where text belongs, invalid UTF-8, a garbage
x-death, ackkit's own headers with the wrong type) give a DeadLetter with
what could be read, and `notes` list what could not.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .._core import deaths
from .._core import headers as H
from ._read import TEXT_MAX as TEXT_MAX  # re-exported: the tests read it here
from ._read import (
    _int,
    _last_death,
    _or_death_queue,
    _Reader,
    _short_repr,
)

_REPLAY_KEEPS = (H.ORIGINAL_EXCHANGE, H.ORIGINAL_ROUTING_KEY)
"""ackkit headers a replayed copy keeps: where the message first came from."""

_BROKER_HEADERS = (
    "x-death",
    "x-first-death-exchange",
    "x-first-death-queue",
    "x-first-death-reason",
    "x-last-death-exchange",
    "x-last-death-queue",
    "x-last-death-reason",
    H.X_DELIVERY_COUNT,
)
"""Headers the broker wrote about the dead copy's past; a replayed copy starts fresh."""


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """What one message in a dead-letter queue says about its death.

    `source` is "ackkit" (ackkit dead-lettered it and wrote its ackkit-*
    headers), "broker" (the broker dead-lettered it through a queue's DLX:
    a rejection, an expired TTL, a length limit, a quorum delivery limit; read
    from x-death) or "unknown" (published there by something else).
    """

    message_id: str | None
    reason: str
    source: str
    error_type: str | None = None
    error_message: str | None = None
    attempts: int | None = None
    original_queue: str | None = None
    original_exchange: str | None = None
    original_routing_key: str | None = None
    listener: str | None = None
    first_failure: str | None = None
    last_failure: str | None = None
    dead_lettered_at: str | None = None
    replayed: int = 0
    body_size: int = 0
    redelivered: bool = False
    unreadable: str | None = None
    """Why some of its properties could not be read (they are left out), else None."""
    notes: tuple[str, ...] = ()
    """Headers that could not be read as expected (wrong type, invalid UTF-8, cut short)."""

    def to_dict(self) -> dict[str, Any]:
        """This dead letter as a JSON-ready dict."""
        out = {f: getattr(self, f) for f in self.__dataclass_fields__}
        out["notes"] = list(self.notes)
        return out


def describe(
    headers: Mapping[str, Any] | None,
    *,
    message_id: str | None = None,
    body_size: int = 0,
    redelivered: bool = False,
    unreadable: str | None = None,
) -> DeadLetter:
    """A DeadLetter from a message's headers (ackkit's own first, then the broker's x-death).

    `unreadable`: why some of the message's properties could not be decoded (the
    headers given are then what could be salvaged, possibly none).

    Total: headers of any shape (wrong types, bytes where text belongs, invalid
    UTF-8, a garbage x-death) give a DeadLetter with what could be read; what
    could not is listed in its `notes`.
    """
    r = _Reader()
    try:
        return _describe(r, headers, message_id, body_size, redelivered, unreadable)
    except Exception as exc:  # a last guard: _describe is meant never to get here
        r.note("headers", f"unreadable ({type(exc).__name__})")
        return DeadLetter(
            message_id=r.text("message_id", message_id),
            reason="unknown (headers could not be read)",
            source="unknown",
            body_size=body_size,
            redelivered=bool(redelivered),
            unreadable=unreadable,
            notes=tuple(r.notes),
        )


def _describe(
    r: _Reader,
    headers: Mapping[str, Any] | None,
    message_id: str | None,
    body_size: int,
    redelivered: bool,
    unreadable: str | None,
) -> DeadLetter:
    h: Mapping[str, Any]
    if headers is None:
        h = {}
    elif isinstance(headers, Mapping):
        h = headers
    else:
        r.note("headers", f"not a table: {_short_repr(headers)}")
        h = {}
    common: dict[str, Any] = {
        "message_id": r.text("message_id", message_id),
        "body_size": body_size,
        "redelivered": bool(redelivered),
        "replayed": r.int(H.REPLAYED, h.get(H.REPLAYED)) or 0,
        "unreadable": unreadable,
    }
    if H.REASON in h:
        reason = r.text(H.REASON, h.get(H.REASON)) or ""
        fields: dict[str, Any] = {
            "error_type": r.text(H.ERROR_TYPE, h.get(H.ERROR_TYPE)),
            "error_message": r.text(H.ERROR_MESSAGE, h.get(H.ERROR_MESSAGE)),
            "attempts": r.int(H.ATTEMPTS, h.get(H.ATTEMPTS)),
            "original_queue": r.name(H.ORIGINAL_QUEUE, h.get(H.ORIGINAL_QUEUE)),
            "original_exchange": r.name(H.ORIGINAL_EXCHANGE, h.get(H.ORIGINAL_EXCHANGE)),
            "original_routing_key": r.name(H.ORIGINAL_ROUTING_KEY, h.get(H.ORIGINAL_ROUTING_KEY)),
            "listener": r.text(H.LISTENER, h.get(H.LISTENER)),
            "first_failure": r.text(H.FIRST_FAILURE, h.get(H.FIRST_FAILURE)),
            "last_failure": r.text(H.LAST_FAILURE, h.get(H.LAST_FAILURE)),
            "dead_lettered_at": r.when(H.DEAD_LETTERED_AT, h.get(H.DEAD_LETTERED_AT)),
        }
        # garbage (or nothing) there: the broker's records may name the queue
        fields["original_queue"] = _or_death_queue(fields["original_queue"], h)
        return DeadLetter(reason=reason, source="ackkit", **fields, **common, notes=tuple(r.notes))
    death = _last_death(r, h.get("x-death"))
    if death is not None:
        keys = death.get("routing-keys")
        key: Any = None
        if isinstance(keys, (list, tuple)):
            key = keys[0] if keys else None
        elif keys is not None:
            r.note("x-death routing-keys", f"expected a list, got {_short_repr(keys)}")
        attempt = h.get(H.ATTEMPT)
        return DeadLetter(
            reason=r.text("x-death reason", death.get("reason")) or "dead-lettered by the broker",
            source="broker",
            attempts=(r.int(H.ATTEMPT, attempt) or None) if attempt is not None else None,
            original_queue=_or_death_queue(r.name("x-death queue", death.get("queue")), h),
            original_exchange=r.name("x-death exchange", death.get("exchange")),
            original_routing_key=r.name("x-death routing-keys", key),
            dead_lettered_at=r.when("x-death time", death.get("time")),
            **common,
            notes=tuple(r.notes),
        )
    queue = deaths.death_queue(h)
    if queue is not None:  # no x-death table, but the broker's x-*-death-queue
        return DeadLetter(
            reason="dead-lettered by the broker",
            source="broker",
            original_queue=queue,
            **common,
            notes=tuple(r.notes),
        )
    if unreadable is not None:
        return DeadLetter(
            reason=f"unreadable properties: {unreadable}",
            source="unknown",
            **common,
            notes=tuple(r.notes),
        )
    return DeadLetter(
        reason="unknown (no ackkit or x-death headers)",
        source="unknown",
        **common,
        notes=tuple(r.notes),
    )


@dataclass(frozen=True, slots=True)
class ReplayFilter:
    """Which dead letters a replay takes; every given criterion must match."""

    error_type: str | None = None
    """Matches the error type's qualified name or its last part ('ValueError')."""
    reason_contains: str | None = None
    """Case-insensitive substring of the reason."""
    message_ids: frozenset[str] = frozenset()

    def matches(self, dl: DeadLetter) -> bool:
        """Whether a dead letter passes every criterion this filter sets."""
        if self.error_type is not None:
            et = dl.error_type or ""
            if et != self.error_type and et.rsplit(".", 1)[-1] != self.error_type:
                return False
        if self.reason_contains is not None and (
            self.reason_contains.lower() not in dl.reason.lower()
        ):
            return False
        return not (self.message_ids and dl.message_id not in self.message_ids)


def replay_target(dl: DeadLetter, to: str | None = None) -> str | None:
    """The queue a replayed copy goes to: `to`, else the queue it was dead-lettered from."""
    return to or dl.original_queue or None  # "" names no queue


def replay_headers(headers: Mapping[str, Any] | None, now: str) -> dict[str, Any]:
    """Headers of the replayed copy: the user's own, where it first came from, and
    ackkit-replayed (how often it was replayed); attempt count and error reset."""
    out: dict[str, Any] = {}
    h = headers if isinstance(headers, Mapping) else {}
    for k, v in h.items():
        if k in _BROKER_HEADERS:
            continue
        if isinstance(k, str) and k.startswith(H.PREFIX) and k not in _REPLAY_KEEPS:
            continue
        out[k] = v
    out[H.REPLAYED] = H.next_count(_int(h.get(H.REPLAYED)))
    out[H.REPLAYED_AT] = now
    return out


@dataclass
class ReplayReport:
    """What a replay did. Running it again is safe: replayed copies left the DLQ."""

    queue: str
    examined: int = 0
    replayed: int = 0
    skipped: int = 0
    """Did not match the filter: left in the DLQ."""
    no_target: int = 0
    """No --to and no known origin queue: left in the DLQ."""
    failed: int = 0
    """The broker refused or could not route the copy: left in the DLQ."""
    targets: dict[str, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    remaining: int | None = None
    """Messages in the DLQ after the replay (passive declare)."""

    @property
    def left(self) -> int:
        """Messages the replay left in the dead-letter queue: skipped, without a target,
        or failed."""
        return self.skipped + self.no_target + self.failed

    def to_dict(self) -> dict[str, Any]:
        """This report as a JSON-ready dict."""
        return {
            "queue": self.queue,
            "examined": self.examined,
            "replayed": self.replayed,
            "skipped": self.skipped,
            "no_target": self.no_target,
            "failed": self.failed,
            "targets": dict(self.targets),
            "errors": list(self.errors),
            "remaining": self.remaining,
        }
