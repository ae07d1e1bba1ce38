"""AMQP URL helpers: never show a password."""

from __future__ import annotations

import re
import urllib.parse

_LETTERS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
_SCHEME_CHARS = _LETTERS | frozenset("0123456789+.-")
_USER_PASSWORD = re.compile(r"[^:@/]*:[^@/]*@")
"""After "scheme://": user, ":", password, "@" (each part stops at the next "/", so at the
next "://" too: every character is looked at a bounded number of times)."""


def mask_url(url: str) -> str:
    """amqp://user:secret@host/vh -> amqp://user:***@host/vh (also inside longer text).

    Every ``scheme://user:password@`` in `url` has its password replaced, in time
    linear in the text's length, whatever the text (a header of megabytes from a
    hostile producer is shown as fast as its size allows, never quadratically).
    """
    out: list[str] = []
    done = 0  # url[:done] is in out
    at = url.find("://")
    while at != -1:
        start = at
        while start > done and url[start - 1] in _SCHEME_CHARS:
            start -= 1
        while start < at and url[start] not in _LETTERS:
            start += 1  # a scheme starts with a letter
        m = _USER_PASSWORD.match(url, at + 3) if start < at else None
        if m is None:
            at = url.find("://", at + 1)
            continue
        colon = url.index(":", at + 3)
        out.append(url[done : colon + 1])
        out.append("***@")
        done = m.end()
        at = url.find("://", done)
    if not out:
        return url
    out.append(url[done:])
    return "".join(out)


def mask_text(text: str, *secrets: str) -> str:
    """Mask URLs with credentials and any given secret strings inside `text`."""
    out = mask_url(text)
    for s in secrets:
        if s:
            out = out.replace(s, "***")
    return out


def check_url(url: object) -> str:
    """`url` if it is an amqp:// or amqps:// URL that parses (or the memory:// URL of an
    `ackkit.testing.InMemoryBroker`), else ValueError / TypeError."""
    from .._core import checks

    checks.text("url", url)
    assert isinstance(url, str)
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number
    except ValueError as exc:
        raise ValueError(f"url {mask_url(url)!r} cannot be parsed: {exc}") from None
    if parts.scheme.lower() not in ("amqp", "amqps", "memory"):  # memory: ackkit.testing
        raise ValueError(f"url must be amqp:// or amqps://, got {mask_url(url)!r}")
    _check_query(url, parts.query)
    return url


# Numeric connection options an AMQP URL's query may carry, as pika and aiormq read them:
# name -> (integer?, lowest, highest). aiormq turns a value it cannot read into 0 (for
# `heartbeat`: heartbeats off) and pika refuses it only when connecting; both runtimes
# refuse it here, when the app is built.
_QUERY_NUMBERS: dict[str, tuple[bool, float, float | None]] = {
    "heartbeat": (True, 0, 65535),
    "channel_max": (True, 1, 65535),
    "frame_max": (True, 4096, 131072),
    "connection_attempts": (True, 1, None),
    "retry_delay": (False, 0, None),
    "socket_timeout": (False, 0, None),
    "stack_timeout": (False, 0, None),
    "blocked_connection_timeout": (False, 0, None),
    "timeout": (False, 0, None),
}

_POSITIVE = {"socket_timeout", "stack_timeout", "timeout"}
"""Of those, the ones that must be above 0 (pika refuses 0 for its own two)."""


def _check_query(url: str, query: str) -> None:
    """ValueError naming the parameter when a numeric connection option in the URL's
    query is not a number in its range."""
    from .._core import checks

    try:
        pairs = urllib.parse.parse_qsl(query, keep_blank_values=True)
    except ValueError as exc:  # e.g. too many fields
        raise ValueError(f"url {mask_url(url)!r}: its query cannot be parsed: {exc}") from None
    for name, raw in pairs:
        rule = _QUERY_NUMBERS.get(name)
        if rule is None:
            continue  # the client library decides
        whole, lo, hi = rule
        option = f"url query parameter {name}"
        try:
            value: float = int(raw) if whole else float(raw)
        except ValueError:
            kind = "an integer" if whole else "a number"
            raise ValueError(f"{option} must be {kind}, got {raw!r:.80}") from None
        if whole:
            checks.integer(option, value, int(lo), None if hi is None else int(hi))
        else:
            checks.number(option, value, lo, hi, above=name in _POSITIVE)
