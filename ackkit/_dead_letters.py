"""What a dead letter says, read from headers of any shape; which copies a replay takes.

No I/O here (the DLQ tool in `_dlq.py` does it with pika). Reading is total:
headers of any type (bytes where text belongs, invalid UTF-8, a garbage
x-death, ackkit's own headers with the wrong type) give a DeadLetter with
what could be read, and `notes` list what could not.
"""

from __future__ import annotations

import datetime as _dt
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ._core import headers as H

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


TEXT_MAX = 2_000
"""Characters of one header value a DeadLetter keeps (the rest is cut, with a note)."""
_NAME_MAX = 255
"""Bytes in an AMQP queue, exchange or routing-key name (a short string)."""
_DIGITS_MAX = 18


_ESCAPED = frozenset({"Cc", "Zl", "Zp"})
"""Unicode categories shown as escapes: control characters and line breaks."""


def _clean(text: str) -> str:
    """`text` made printable and encodable: lone surrogates and control characters
    become backslash escapes (a header is not allowed to move a terminal's cursor)."""
    if not text.isprintable():
        text = "".join(
            c.encode("unicode_escape").decode("ascii") if unicodedata.category(c) in _ESCAPED else c
            for c in text
        )
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _short_repr(value: Any) -> str:
    """repr() of a header value of any shape, bounded however large or deep it is."""
    import reprlib

    r = reprlib.Repr()
    r.maxstring = r.maxother = r.maxlong = 80
    r.maxlist = r.maxtuple = r.maxdict = 8
    r.maxlevel = 3
    try:
        return _clean(r.repr(value))
    except Exception:  # a value whose repr fails still gets a name
        return f"<{type(value).__name__}>"


class _Reader:
    """Reads header values into the types a DeadLetter holds; never raises.

    What it could not read (a wrong type, invalid UTF-8, a value cut short) is
    described in `notes`, one line per header."""

    def __init__(self) -> None:
        self.notes: list[str] = []

    def note(self, key: str, what: str) -> None:
        self.notes.append(f"{_clean(key)}: {what}")

    def text(self, key: str, value: Any) -> str | None:
        """Any value as display text (bytes decoded, other types shown as repr)."""
        if value is None:
            return None
        if isinstance(value, bytes):
            try:
                text = value.decode("utf-8")
            except UnicodeDecodeError:
                self.note(key, "invalid UTF-8 (undecodable bytes shown as \\x..)")
                text = value.decode("utf-8", "backslashreplace")
        elif isinstance(value, str):
            text = value
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            text = str(value)
        else:
            self.note(key, f"expected text, got {type(value).__name__}")
            return _short_repr(value)
        if len(text) > TEXT_MAX:
            self.note(key, f"{len(text)} characters, cut to {TEXT_MAX}")
            text = text[:TEXT_MAX] + "..."
        return _clean(text)

    def name(self, key: str, value: Any) -> str | None:
        """A queue / exchange / routing-key name: text the broker could route by, or None."""
        if value is None:
            return None
        if isinstance(value, bytes):
            try:
                value = value.decode("utf-8")
            except UnicodeDecodeError:
                self.note(key, f"not a name (invalid UTF-8): {_short_repr(value)}")
                return None
        if not isinstance(value, str):
            self.note(key, f"not a name ({type(value).__name__}): {_short_repr(value)}")
            return None
        try:
            size = len(value.encode("utf-8"))
        except UnicodeEncodeError:
            self.note(key, f"not a name (unencodable text): {_short_repr(value)}")
            return None
        if size > _NAME_MAX:
            self.note(key, f"not a name ({size} bytes, at most {_NAME_MAX})")
            return None
        if any(ord(c) < 32 or ord(c) == 127 for c in value):
            # ackkit refuses such queue names itself; shown escaped, never routed to
            self.note(key, f"not a name (control characters): {_short_repr(value)}")
            return None
        return value

    def int(self, key: str, value: Any) -> int | None:
        """A non-negative count (an int, or its decimal digits as text)."""
        if value is None:
            return None
        if isinstance(value, int) and not isinstance(value, bool):
            if value >= 0:
                return value
        elif isinstance(value, (str, bytes)):
            text = value.strip()
            if text.isascii() and text.isdigit() and len(text) <= _DIGITS_MAX:
                return int(text)
        self.note(key, f"expected a count, got {_short_repr(value)}")
        return None

    def when(self, key: str, value: Any) -> str | None:
        if isinstance(value, _dt.datetime):
            return value.isoformat()
        return self.text(key, value)


def _int(value: Any) -> int | None:
    return _Reader().int("", value)


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
    queue = _death_queue(h)
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


def _last_death(r: _Reader, deaths: Any) -> Mapping[str, Any] | None:
    """The most recent x-death entry (the broker keeps it first), or None."""
    if deaths is None:
        return None
    if not isinstance(deaths, (list, tuple)):
        r.note("x-death", f"expected a list of tables, got {_short_repr(deaths)}")
        return None
    for i, d in enumerate(deaths):
        if isinstance(d, Mapping):
            if i:
                r.note("x-death", f"{i} leading entr{'y' if i == 1 else 'ies'} not a table")
            return d
    r.note("x-death", f"no table among its {len(deaths)} entries")
    return None


def _or_death_queue(queue: str | None, h: Mapping[str, Any]) -> str | None:
    """`queue`, unless it names no queue and the broker's records name one."""
    return queue or _death_queue(h) or queue


def _death_queue(h: Mapping[str, Any]) -> str | None:
    """The most recent queue the broker's records name validly, whatever garbage is
    next to it: each x-death table's `queue` (most recent first), then
    x-last-death-queue and x-first-death-queue. None when none is a usable name."""
    quiet = _Reader()  # what could not be read is noted where it is read first
    deaths = h.get("x-death")
    if isinstance(deaths, (list, tuple)):
        for d in deaths:
            if isinstance(d, Mapping):
                q = quiet.name("", d.get("queue"))
                if q:
                    return q
    for key in ("x-last-death-queue", "x-first-death-queue"):
        q = quiet.name("", h.get(key))
        if q:
            return q
    return None


@dataclass(frozen=True, slots=True)
class ReplayFilter:
    """Which dead letters a replay takes; every given criterion must match."""

    error_type: str | None = None
    """Matches the error type's qualified name or its last part ('ValueError')."""
    reason_contains: str | None = None
    """Case-insensitive substring of the reason."""
    message_ids: frozenset[str] = frozenset()

    def matches(self, dl: DeadLetter) -> bool:
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
        return self.skipped + self.no_target + self.failed

    def to_dict(self) -> dict[str, Any]:
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
