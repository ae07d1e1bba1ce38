"""AMQP URL helpers: never show a password."""

from __future__ import annotations

import re
import urllib.parse

_CRED = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)(?P<user>[^:@/]*):(?P<pw>[^@/]*)@")


def mask_url(url: str) -> str:
    """amqp://user:secret@host/vh -> amqp://user:***@host/vh (also inside longer text)."""
    return _CRED.sub(lambda m: f"{m['scheme']}{m['user']}:***@", url)


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
    from ._core import checks

    checks.text("url", url)
    assert isinstance(url, str)
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number
    except ValueError as exc:
        raise ValueError(f"url {mask_url(url)!r} cannot be parsed: {exc}") from None
    if parts.scheme.lower() not in ("amqp", "amqps", "memory"):  # memory: ackkit.testing
        raise ValueError(f"url must be amqp:// or amqps://, got {mask_url(url)!r}")
    return url
