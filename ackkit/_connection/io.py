"""What both runtimes share about talking to a broker, whatever the client library.

The connect errors (retried with backoff, or fatal), the reconnect backoff and
its log line, and the tick period of time-based ack flushing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from tenacity import wait_exponential, wait_random
from tenacity.wait import wait_base

from .._core.errors import AckkitError
from .url import mask_text

log = logging.getLogger("ackkit")

TICK = 0.05
"""Seconds between core.tick() calls (time-based ack flushing)."""


class ConnectFailed(AckkitError):
    """The connection could not be opened (retried with backoff)."""


class FatalConnectError(AckkitError):
    """Connecting failed in a way retrying cannot fix (credentials, vhost, topology)."""


def reconnect_wait(max_interval: float) -> wait_base:
    """Backoff between connection attempts: 0.2 s doubling up to `max_interval`, plus jitter."""
    return wait_exponential(multiplier=0.2, max=max_interval) + wait_random(0, 0.2)


def reconnect_logger(safe_url: str | Callable[[], str]) -> Callable[[Any], None]:
    """tenacity before_sleep for both runtimes' reconnect loops (the URL already masked;
    or a function giving the one the failed attempt used, for several node addresses)."""

    def before_sleep(rs: Any) -> None:
        log.warning(
            "connecting to %s failed (attempt %d): %s; retrying",
            safe_url if isinstance(safe_url, str) else safe_url(),
            rs.attempt_number,
            mask_text(str(rs.outcome.exception()) if rs.outcome else ""),
        )

    return before_sleep
