"""AMQP URL helpers: never show a password."""

from __future__ import annotations

import re

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
