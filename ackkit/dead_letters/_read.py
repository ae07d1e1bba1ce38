"""Reading dead-letter headers of any shape (moved out of `_letter.py`): the
total `_Reader`; the broker's x-death records are read by the core (`_core/deaths.py`).

No I/O; never raises on header values.
"""

from __future__ import annotations

import datetime as _dt
import unicodedata
from collections.abc import Mapping
from typing import Any

from .._core import deaths

TEXT_MAX = 2_000
"""Characters of one header value a DeadLetter keeps (the rest is cut, with a note)."""
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
        name, why = deaths.queue_name(value)
        if why is not None:
            self.note(key, f"not a name ({why}): {_short_repr(value)}")
        return name

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


def _last_death(r: _Reader, value: Any) -> Mapping[Any, Any] | None:
    """The most recent x-death record (`deaths.last_death`), what was odd about it noted."""
    death, note = deaths.last_death(value)
    if note is not None:
        r.note("x-death", note)
    return death


def _or_death_queue(queue: str | None, h: Mapping[str, Any]) -> str | None:
    """`queue`, unless it names no queue and the broker's records name one."""
    return queue or deaths.death_queue(h) or queue
