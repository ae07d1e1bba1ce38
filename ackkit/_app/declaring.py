"""What a runtime declares for some of its listeners (all of them when a connection
opens; one whose queue was deleted, later): shared by the App and AsyncApp runtimes."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from .._core.exchanges import Plan, plan
from .._telemetry.logs import log_dropped_arguments


def declaration(
    consumers: Sequence[Any], app_exchanges: Plan, app_listeners: int, log: logging.Logger
) -> tuple[list[Any], list[tuple[str, Any]], list[str], Plan]:
    """(ackkit's own queues, the listeners' queues with their arguments, the queues only
    checked, the exchanges and bindings) for `consumers` (each with `.core` and `.spec`).
    The app's whole exchange plan when these are all its listeners, else theirs only."""
    own = [q for c in consumers for q in c.core.queues.topology()]
    user = []
    for c in consumers:
        if c.spec.declare:
            args, dropped = c.core.queues.queue_arguments(c.spec.queue_arguments)
            log_dropped_arguments(log, c.spec.queue, dropped)
            user.append((c.spec.queue, args))
    existing = [c.spec.queue for c in consumers if not c.spec.declare]
    exchanges = app_exchanges
    if len(consumers) < app_listeners:
        exchanges = plan((c.spec.queue, c.spec.binds) for c in consumers)
    return own, user, existing, exchanges
