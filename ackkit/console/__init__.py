"""ackkit console: a web page to see, group and replay dead letters (`ackkit console`).

Needs the `console` extra: pip install 'ackkit[console]' (Starlette, Jinja2, uvicorn).
How it holds dead letters, and what happens when it stops: docs/guide/console.md.
"""

from __future__ import annotations

from ._groups import GroupKey, group_key, normalise
from ._holder import ActionResult, Holder
from ._security import Access
from ._serve import dlqs_of_app, serve
from ._store import Store

__all__ = [
    "Access",
    "ActionResult",
    "GroupKey",
    "Holder",
    "Store",
    "create_app",
    "dlqs_of_app",
    "group_key",
    "normalise",
    "serve",
]


def __getattr__(name: str) -> object:
    if name == "create_app":  # imports Starlette and Jinja2
        from ._web import create_app

        return create_app
    raise AttributeError(name)
