"""Reading dead-letter headers of any shape (moved out of `_dead_letters.py`): the
total `_Reader`, and which queue the broker's x-death records say a copy died in.

No I/O; never raises on header values.
"""

from __future__ import annotations

import datetime as _dt
import unicodedata
from collections.abc import Mapping
from typing import Any

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
