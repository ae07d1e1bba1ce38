"""Retention: keys older than `Inbox.retention` are deleted in small batches."""

from __future__ import annotations

from typing import Any

from ._options import Inbox
from ._sql import expire


def expire_batch(store: Any, inbox: Inbox) -> int:
    """Delete one batch of expired keys (at most `retention_batch`); how many went."""
    older = float(inbox.retention or 0)
    if inbox.in_memory:
        return int(store.store.expire(older, inbox.retention_batch))
    with store.transaction() as tx:
        cur = tx.db.execute(expire(inbox.table), (older, inbox.retention_batch))
        return int(cur.rowcount)
