"""Failure groups: which dead letters are "the same failure".

A group is the listener (or the queue the message died in) + the error type +
the error message with what varies between occurrences folded away: quoted
values (to '…'), UUIDs, long hex ids and numbers (all three to #: one hole of a
message may hold a number in one occurrence and a hex id in the next).
"order 1234 not found ('abc')" and "order 99 not found ('x')" fall into one
group, "order # not found ('…')". No I/O here.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

from ..dead_letters._letter import DeadLetter

MESSAGE_MAX = 200
"""Characters of a normalised message kept (a group is named by it)."""

_QUOTED = re.compile(r"'[^']*'|\"[^\"]*\"")
_UUID = re.compile(r"\b[0-9a-fA-F]{8}(?:-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}\b")
_SIGN = r"(?:(?<!\w)[-+])?"
"""A sign only where no word character comes before it: in `ord-00058` or `x+1` the
hyphen or plus belongs to the text (folded to `ord-#`), in `balance -5` it is a sign."""
_HEX = re.compile(_SIGN + r"\b(?:0x)?(?=[0-9a-fA-F]*[a-fA-F])(?=[0-9a-fA-F]*\d)[0-9a-fA-F]{8,}\b")
"""Hex ids with a letter and a digit (all-digit ones are numbers, folded the same)."""
_NUMBER = re.compile(_SIGN + r"\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")
_SPACE = re.compile(r"\s+")


def _quoted(m: re.Match[str]) -> str:
    q = m.group(0)[0]
    return f"{q}…{q}"


def normalise(message: str) -> str:
    """`message` with quoted values, UUIDs, hex ids and numbers folded, blanks collapsed.

    Idempotent; the result has no decimal digits and at most MESSAGE_MAX characters.
    """
    out = _QUOTED.sub(_quoted, message)
    out = _UUID.sub("#", out)
    out = _HEX.sub("#", out)
    out = _NUMBER.sub("#", out)
    out = _SPACE.sub(" ", out).strip()
    if len(out) > MESSAGE_MAX:
        out = out[: MESSAGE_MAX - 1] + "…"
    return out


@dataclass(frozen=True, slots=True)
class GroupKey:
    """What dead letters of one failure group share."""

    dlq: str
    listener: str
    error_type: str
    message: str

    @property
    def id(self) -> str:
        """A short stable name for URLs (the same key gives the same id in every run)."""
        raw = "\x00".join((self.dlq, self.listener, self.error_type, self.message))
        return hashlib.sha256(raw.encode("utf-8", "backslashreplace")).hexdigest()[:16]


def group_key(dlq: str, dl: DeadLetter) -> GroupKey:
    """The failure group of a dead letter read from `dlq`."""
    listener = dl.listener or dl.original_queue or "(unknown)"
    if dl.error_type:
        error_type = dl.error_type
        message = normalise(dl.error_message or "")
    else:  # dead-lettered by the broker (expired, rejected, maxlen, ...) or unknown
        error_type = f"({dl.source})"
        message = normalise(dl.reason)
    return GroupKey(dlq, listener, error_type, message)
