"""ackkit's log lines about deliveries: structured context, bounded volume, no credentials.

Every line about one delivery (a failed handler, a dead letter, a settle dropped
for a closed channel, a handler that returned without settling, a rejection)
carries the same fields as `extra=` on its LogRecord, for JSON formatters and
log pipelines: `listener`, `queue`, `message_id`, `attempt`, `outcome`, plus
`reason` and `delivery_tag` where there is one. Text that may quote a broker URL
goes through `mask_text`. A flood (10,000 poison messages) writes a few lines a
second per kind, and the next line says how many were left out.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from .._connection.url import mask_text
from .._core.events import Event, Stage
from .._core.tb import format_traceback, qualname, text_of

log = logging.getLogger("ackkit")


def delivery_extra(
    listener: str,
    queue: str,
    message_id: str | None,
    attempt: int,
    outcome: str,
    **more: Any,
) -> dict[str, Any]:
    """The `extra=` of a log line about one delivery."""
    return {
        "listener": listener,
        "queue": queue,
        "message_id": message_id,
        "attempt": attempt,
        "outcome": outcome,
        **more,
    }


class Throttle:
    """At most `burst` lines in every `window` seconds; counts the ones left out."""

    def __init__(
        self, burst: int = 10, window: float = 1.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.burst = burst
        self.window = window
        self._clock = clock
        self._lock = threading.Lock()
        self._start = -window
        self._logged = 0
        self._skipped = 0

    def admit(self) -> int | None:
        """None: leave this line out. Else how many lines were left out before it."""
        with self._lock:
            now = self._clock()
            if now - self._start >= self.window:
                self._start, self._logged = now, 0
            if self._logged >= self.burst:
                self._skipped += 1
                return None
            self._logged += 1
            skipped, self._skipped = self._skipped, 0
            return skipped


# stage -> (level, outcome, what the line says happened)
_LINES: dict[Stage, tuple[int, str, str]] = {
    Stage.DEAD_LETTERED: (logging.WARNING, "dead_lettered", "dead-lettered"),
    Stage.REJECTED: (
        logging.WARNING,
        "rejected",
        "rejected without requeue (to the queue's dead-letter exchange, or dropped if it has none)",
    ),
    Stage.UNSETTLED: (logging.WARNING, "unsettled", "not settled by the handler"),
    Stage.COPY_REFUSED: (logging.WARNING, "copy_refused", "copy refused by the broker"),
    Stage.DROPPED_STALE: (
        logging.INFO,
        "stale_dropped",
        "settle dropped, its channel is closed (the broker requeued the message)",
    ),
}


# listener-level stages -> (level, what the line says happened)
_FLOW_LINES: dict[Stage, tuple[int, str]] = {
    Stage.PAUSED: (logging.INFO, "paused (consumer cancelled, held deliveries returned)"),
    Stage.RESUMED: (logging.INFO, "resumed"),
    Stage.TRIPPED: (
        logging.WARNING,
        "circuit breaker tripped (consumer cancelled, held deliveries returned)",
    ),
    Stage.PROBING: (logging.INFO, "circuit breaker half-open, probing"),
    Stage.RECOVERED: (logging.INFO, "recovered, consuming again"),
}


def flow_line(ev: Event) -> str | None:
    """A one-line description of a listener-level event (pause, breaker), else None."""
    flow = _FLOW_LINES.get(ev.stage)
    if flow is None:
        return None
    return f"{ev.listener}: {flow[1]}: {mask_text(ev.reason) or '-'}"


class LifecycleLog:
    """An observer writing one line per dead letter, rejection, unsettled or stale delivery.

    `hot = False`: the core does not call it for RECEIVED and ACKED, so it costs
    a healthy message nothing.
    """

    hot = False

    def __init__(self, queues: Mapping[str, str], logger: logging.Logger = log) -> None:
        self.queues = dict(queues)  # listener name -> queue
        self.logger = logger
        self._throttles = {stage: Throttle() for stage in _LINES}

    def __call__(self, ev: Event) -> None:
        line = _LINES.get(ev.stage)
        if line is None:
            flow = _FLOW_LINES.get(ev.stage)
            if flow is not None:
                self.logger.log(
                    flow[0],
                    "%s: %s: %s",
                    ev.listener,
                    flow[1],
                    mask_text(ev.reason) or "-",
                    extra={
                        "listener": ev.listener,
                        "queue": self.queues.get(ev.listener, ""),
                        "outcome": ev.stage.value,
                    },
                )
            return
        level, outcome, what = line
        if not self.logger.isEnabledFor(level):
            return
        skipped = self._throttles[ev.stage].admit()
        if skipped is None:
            return
        reason = mask_text(ev.reason)
        more = f" ({skipped} more not logged)" if skipped else ""
        self.logger.log(
            level,
            "%s: message %s (attempt %d) %s: %s%s",
            ev.listener,
            ev.message_id or f"tag {ev.tag}",
            ev.attempt,
            what,
            reason or "-",
            more,
            extra=delivery_extra(
                ev.listener,
                self.queues.get(ev.listener, ""),
                ev.message_id,
                ev.attempt,
                outcome,
                reason=reason,
                delivery_tag=ev.tag,
            ),
        )


def short(exc: BaseException) -> str:
    """One log-friendly line for an exception, credentials masked."""
    s = f"{type(exc).__name__}: {text_of(exc)}"
    return mask_text(s if len(s) < 300 else s[:297] + "...")


MAX_LOGGED_TRACEBACK = 8000
"""Characters of a traceback in a log line (its end: the innermost frames and the error)."""


def log_traceback(exc: BaseException) -> str:
    """The traceback of `exc` for a log line: masked, at most MAX_LOGGED_TRACEBACK
    characters (a cut start says so), and writable by any handler (characters UTF-8
    cannot encode, like a lone surrogate, are escaped)."""
    text = format_traceback(exc).rstrip()
    if len(text) > MAX_LOGGED_TRACEBACK:  # cut before masking, at a line start
        tail = text[-MAX_LOGGED_TRACEBACK:]
        text = "...\n" + tail[tail.find("\n") + 1 :] if "\n" in tail else "...\n" + tail
    text = mask_text(text)
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


class FailureLog:
    """Warnings about failed handlers, with tracebacks, without a logging flood.

    The first failure of each kind (listener and error type) is logged with its
    traceback, and again at most every `traceback_every` seconds; so a message
    that fails once and then succeeds on a retry still leaves its traceback in
    the log. Every other failure is one line, at most `burst` of them in every
    `window` seconds; the failures left out are counted and the next line says
    how many there were. A poison flood of 10,000 messages then writes a few
    dozen lines instead of 10,000 (each failure still reaches the observers, the
    counters and, when dead-lettered, the DLQ with its traceback). A line about
    a Delivery carries its context as `extra=` (listener, queue, message_id,
    attempt, outcome="failed", error_type).
    """

    MAX_KINDS = 1000
    """Kinds remembered for the traceback rule (beyond that, the oldest are forgotten)."""

    def __init__(
        self,
        logger: logging.Logger,
        burst: int = 10,
        window: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        traceback_every: float = 60.0,
    ) -> None:
        self.logger = logger
        self._throttle = Throttle(burst, window, clock)
        self._clock = clock
        self._every = traceback_every
        self._lock = threading.Lock()
        self._last_tb: dict[tuple[str, str], float] = {}

    def _traceback_due(self, listener: str, exc: BaseException) -> bool:
        key = (listener, qualname(exc))
        with self._lock:
            now = self._clock()
            last = self._last_tb.get(key)
            if last is not None and now - last < self._every:
                return False
            self._last_tb.pop(key, None)
            self._last_tb[key] = now
            if len(self._last_tb) > self.MAX_KINDS:
                del self._last_tb[next(iter(self._last_tb))]
            return True

    def failed(self, listener: str, what: object, exc: BaseException) -> None:
        if not self.logger.isEnabledFor(logging.WARNING):
            return
        with_tb = self._traceback_due(listener, exc)
        skipped = 0 if with_tb else self._throttle.admit()
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
        # The traceback is part of the message, masked like the rest (an exception may
        # quote a broker URL with its password).
        tb = "\n" + log_traceback(exc) if with_tb else ""
        self.logger.warning(
            "%s: handler failed on %r: %s%s%s", listener, what, short(exc), more, tb, extra=extra
        )


# -- instrumentation hooks (metrics, tracing) ---------------------------------


def log_stop(what: str, exc: BaseException, exit_signals: tuple[type[BaseException], ...]) -> None:
    """The ERROR line of the health rule: why the app stops itself (both runtimes'
    `fail()`). An interpreter-exit signal a handler raised needs no traceback."""
    if isinstance(exc, exit_signals):
        log.error("%s; stopping the app", what)
    else:
        log.error("%s: %s; stopping the app", what, short(exc), exc_info=exc)


def log_attempt(safe_url: str, index: int, count: int) -> None:
    """The INFO line both runtimes log before a connection attempt to node address
    `index` (from 0) of `count` (`safe_url`, masked); none with a single address."""
    if count > 1:
        log.info("connecting to %s (node address %d of %d)", safe_url, index + 1, count)


def log_cancel(logger: logging.Logger, listener: str, outstanding: int) -> None:
    """The one WARNING both runtimes log when the broker cancelled a listener's consumer."""
    logger.warning(
        "%s: the broker cancelled the consumer (a consumer timeout on RabbitMQ 4.3+, or its "
        "queue was deleted); %d deliveries in flight go back to the queue and their "
        "settles are dropped; consuming again on a new channel",
        listener,
        outstanding,
    )


def log_dropped_arguments(logger: logging.Logger, queue: str, dropped: tuple[str, ...]) -> None:
    """The WARNING both runtimes log for queue arguments the broker would refuse."""
    if dropped:
        logger.warning(
            "queue %r: declared without %s (RabbitMQ 4.3+ removed classic queue v1; the "
            "queue is a CQv2 queue)",
            queue,
            ", ".join(dropped),
        )


def log_blocked(connection: str, reason: str | None) -> None:
    """The broker's connection.blocked (`reason`, e.g. "low on memory") or, with None,
    connection.unblocked, in ackkit's own words: what waits while it lasts."""
    if reason is None:
        log.info(
            "the broker unblocked connection %r: publishes and copies go out again", connection
        )
        return
    log.warning(
        "the broker blocked connection %r (%s: a memory or disk alarm): its publishes and "
        "retry or dead-letter copies wait until the alarm clears, and the originals of "
        "unsent copies stay in the queue",
        connection,
        reason,
    )
