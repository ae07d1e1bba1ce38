"""Runtime-neutral pieces shared by the pika and the aio-pika runtimes.

Nothing here talks to a broker or imports a client library: batch outcome
bookkeeping, header merging for republished copies, the reconnect backoff and
the connect errors. The core decides; these helpers only shape what a runtime
hands to it and takes back from it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tenacity import wait_exponential, wait_random
from tenacity.wait import wait_base

from ._core.errors import AckkitError
from ._core.tb import text_of
from ._delivery import Delivery
from ._logs import Throttle, delivery_extra
from ._url import mask_text

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


def reconnect_logger(safe_url: str) -> Callable[[Any], None]:
    """tenacity before_sleep for both runtimes' reconnect loops (the URL already masked)."""

    def before_sleep(rs: Any) -> None:
        log.warning(
            "ackkit: connecting to %s failed (attempt %d): %s; retrying",
            safe_url,
            rs.attempt_number,
            mask_text(str(rs.outcome.exception()) if rs.outcome else ""),
        )

    return before_sleep


def publish_properties(
    headers: Mapping[str, Any] | None,
    message_id: str | None,
    content_type: str | None,
    persistent: bool,
    props: Mapping[str, Any],
) -> dict[str, Any]:
    """Keyword arguments of the basic properties for a pull-mode publish (both clients
    name the AMQP properties the same way)."""
    return {
        "headers": dict(headers) if headers else None,
        "message_id": message_id,
        "content_type": content_type,
        "delivery_mode": 2 if persistent else 1,
        **props,
    }


def merge_headers(
    headers: Mapping[str, Any] | None, set_headers: Mapping[str, Any]
) -> dict[str, Any]:
    """A copy of `headers` with `set_headers` merged in (None removes a header)."""
    out = dict(headers or {})
    for k, v in set_headers.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = v
    return out


def short(exc: BaseException) -> str:
    """One log-friendly line for an exception, credentials masked."""
    s = f"{type(exc).__name__}: {text_of(exc)}"
    return mask_text(s if len(s) < 300 else s[:297] + "...")


class FailureLog:
    """Warnings about failed handlers without a logging flood.

    At most `burst` lines in every `window` seconds; the failures left out are
    counted and the next line says how many there were. A poison flood of
    10,000 messages then writes a few dozen lines instead of 10,000 (each
    failure still reaches the observers, the counters and, when dead-lettered,
    the DLQ with its traceback). A line about a Delivery carries its context as
    `extra=` (listener, queue, message_id, attempt, outcome="failed", error_type).
    """

    def __init__(
        self,
        logger: logging.Logger,
        burst: int = 10,
        window: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.logger = logger
        self._throttle = Throttle(burst, window, clock)

    def failed(self, listener: str, what: object, exc: BaseException) -> None:
        if not self.logger.isEnabledFor(logging.WARNING):
            return
        skipped = self._throttle.admit()
        if skipped is None:
            return
        more = f" ({skipped} more failures not logged)" if skipped else ""
        extra = delivery_extra(
            listener,
            getattr(what, "queue", ""),
            getattr(what, "message_id", None),
            getattr(what, "attempt", 0),
            "failed",
            error_type=type(exc).__name__,
        )
        self.logger.warning(
            "%s: handler failed on %r: %s%s", listener, what, short(exc), more, extra=extra
        )


# -- instrumentation hooks (metrics, tracing) ---------------------------------

HandlerDone = Callable[[BaseException | None], None]
"""Called when a handler invocation has ended: None when it returned, else what it raised."""

HandlerProbe = Callable[[Sequence[Delivery]], HandlerDone]
"""Called just before a handler runs for these deliveries (one, or a batch), on the
thread or task that runs it; the HandlerDone it returns is called there when the
handler has returned or raised. Runtimes call a listener's probe only when it has
one (`AppBase._instrument`), so an uninstrumented app pays nothing."""
