"""What both runtimes share about talking to a broker, whatever the client library.

The connect errors (retried with backoff, or fatal), the reconnect backoff, its
log line and the loop's policy made of them, connecting to the first of several
node addresses that answers, and the tick period of time-based ack flushing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeVar

from tenacity import wait_exponential, wait_random
from tenacity.retry import retry_base
from tenacity.wait import wait_base

from .._core.errors import AckkitError
from .addresses import Rotation
from .url import mask_text, mask_url

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


T = TypeVar("T")


def connect_in_turn(
    rotation: Rotation,
    connect: Callable[[str], T],
    *,
    final: tuple[type[BaseException], ...] = (),
    what: str = "",
) -> T:
    """`connect(url)` to the rotation's current node address, and when that raises, to
    each next one in turn, once around; the last error is raised when none answered.

    For the tools that connect once per session (dead-letter commands, the console, the
    outbox relay, the Spark sources' side connections): an error of a type in `final`
    (wrong credentials, a refused virtual host: the same on every node) is raised at
    once. Every failure but the last is logged, passwords masked (`what` names the
    connection in the line). The rotation is left on the address that answered."""
    label = f"{what}: " if what else ""
    for tries_left in range(len(rotation.urls) - 1, -1, -1):
        url = rotation.current
        try:
            return connect(url)
        except Exception as exc:
            if not tries_left or isinstance(exc, final):
                raise
            log.warning(
                "%sconnecting to %s (node address %d of %d) failed: %s; trying the next one",
                label,
                mask_url(url),
                rotation.index + 1,
                len(rotation.urls),
                mask_text(f"{type(exc).__name__}: {exc}"),
            )
            rotation.advance()
    raise AssertionError("unreachable")  # pragma: no cover


def reconnect_policy(
    max_interval: float, retry: retry_base, safe_url: Callable[[], str]
) -> dict[str, Any]:
    """The tenacity arguments both runtimes' reconnect loops share (`Retrying(**...)`,
    `AsyncRetrying(**...)`): the backoff, which failures `retry` tries again, the
    warning before each wait (`safe_url`: the address the failed attempt used), and
    the last failure raised."""
    return {
        "wait": reconnect_wait(max_interval),
        "retry": retry,
        "reraise": True,
        "before_sleep": reconnect_logger(safe_url),
    }
