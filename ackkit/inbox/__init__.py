"""Exactly-once database effects: a transactional inbox on PostgreSQL.

    from ackkit.inbox import Inbox

    @app.listener("orders", inbox=Inbox("postgresql://app@db/shop"))
    def on_order(order: Order, delivery: Delivery) -> None:
        delivery.db.execute("INSERT INTO shipments ...")   # same transaction as the key

See docs/guide/exactly-once.md. psycopg 3 is needed for PostgreSQL
(``pip install 'ackkit[postgres]'``); ``Inbox("memory://name")`` needs nothing.
"""

from __future__ import annotations

from .._core.inbox import MAX_KEY_LENGTH, MissingKey
from ._errors import SwallowedDatabaseError
from ._memory import memory_inbox
from ._options import DEFAULT_RETENTION, Inbox
from ._outbox import aenqueue, enqueue
from ._sql import schema

SCHEMA = schema()
"""The SQL creating the inbox and outbox tables under their default names (for a
migration of your own: `Inbox(create_tables=False)` then)."""

__all__ = [
    "DEFAULT_RETENTION",
    "MAX_KEY_LENGTH",
    "SCHEMA",
    "Inbox",
    "MissingKey",
    "SwallowedDatabaseError",
    "aenqueue",
    "enqueue",
    "memory_inbox",
    "schema",
]
