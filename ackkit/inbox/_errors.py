"""The inbox's public errors (importable without psycopg)."""

from __future__ import annotations


class SwallowedDatabaseError(Exception):
    """An inbox handler caught a database error and returned: its transaction is aborted,
    so the call failed (rolled back, then retried or dead-lettered by the listener's
    rules). Its qualified name, ``ackkit.inbox.SwallowedDatabaseError``, is what a dead
    letter's error type shows; `Retry(fatal=(SwallowedDatabaseError,))` dead-letters
    such calls at once."""


SwallowedDatabaseError.__module__ = "ackkit.inbox"
