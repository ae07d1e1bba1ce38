"""The headers ackkit sets on each copy it publishes: retry, dead-letter and restamp.

Pure functions of the delivery (`Tracked`), the listener's policy, the
exception and the time: they return the Republish's `set_headers` (a value of
None removes that header from the copy). What else a copy carries, and how it
is made to fit a frame, is `copies.copy_properties`.

Every copy drops x-delivery-count: the copy is a new message, and a quorum
queue's count of the original's deliveries must not come along (it would be
counted twice). Every copy keeps where the message was first published
(ackkit-original-exchange / -routing-key), from the first copy on.
"""

from __future__ import annotations

import datetime as _dt
from typing import Any

from . import headers as H
from .policy import ListenerPolicy
from .tb import bounded, format_traceback, qualname, text_of
from .tracked import Tracked

ERROR_TEXT_LIMIT = 1000
"""Longest ackkit-error-message and ackkit-reason (characters)."""


def iso(ts: float) -> str:
    """A wall-clock timestamp as the ISO 8601 text the failure headers carry (UTC, ms)."""
    return _dt.datetime.fromtimestamp(ts, _dt.UTC).isoformat(timespec="milliseconds")


def _origin(t: Tracked, hdrs: dict[str, Any]) -> None:
    """Name the exchange and routing key `t` was first published with, unless a copy
    before it already did."""
    if not (t.headers and H.ORIGINAL_EXCHANGE in t.headers):
        hdrs[H.ORIGINAL_EXCHANGE] = t.exchange
        hdrs[H.ORIGINAL_ROUTING_KEY] = t.routing_key


def retry_headers(t: Tracked, exc: BaseException, now: float) -> dict[str, Any]:
    """A broker retry copy of `t`, which failed with `exc` at wall-clock time `now`:
    the next attempt's number, the error, and when the failures began and last were."""
    stamp = iso(now)
    hdrs: dict[str, Any] = {
        H.ATTEMPT: t.attempt + 1,
        H.X_DELIVERY_COUNT: None,
        H.LAST_FAILURE: stamp,
        H.ERROR_TYPE: qualname(exc),
        H.ERROR_MESSAGE: bounded(text_of(exc), ERROR_TEXT_LIMIT),
    }
    if not (t.headers and H.FIRST_FAILURE in t.headers):
        hdrs[H.FIRST_FAILURE] = stamp
    _forget_restamp(t, hdrs)
    _origin(t, hdrs)
    return hdrs


def dead_letter_headers(
    t: Tracked,
    policy: ListenerPolicy,
    reason: str,
    exc: BaseException | None,
    tb: str | None,
    now: float,
    attempts: int | None = None,
) -> dict[str, Any]:
    """The dead letter of `t`: why (`reason`), after how many attempts (`attempts`, by
    default the delivery's own), which listener and queue, the error and its traceback
    (`tb`, else formatted from `exc`, cut to the policy's max_traceback), and when."""
    stamp = iso(now)
    old = t.headers or {}
    hdrs: dict[str, Any] = {
        H.REASON: bounded(reason, ERROR_TEXT_LIMIT),
        H.ATTEMPTS: t.attempt if attempts is None else attempts,
        H.LISTENER: policy.name,
        H.ORIGINAL_QUEUE: policy.queue,
        H.ORIGINAL_EXCHANGE: old.get(H.ORIGINAL_EXCHANGE, t.exchange),
        H.ORIGINAL_ROUTING_KEY: old.get(H.ORIGINAL_ROUTING_KEY, t.routing_key),
        H.FIRST_FAILURE: old.get(H.FIRST_FAILURE) or t.first_failure or stamp,
        H.LAST_FAILURE: stamp,
        H.DEAD_LETTERED_AT: stamp,
        H.X_DELIVERY_COUNT: None,
    }
    if exc is not None:
        hdrs[H.ERROR_TYPE] = qualname(exc)
        hdrs[H.ERROR_MESSAGE] = bounded(text_of(exc), ERROR_TEXT_LIMIT)
    if tb is None and exc is not None and exc.__traceback__ is not None:
        tb = format_traceback(exc)  # only dead letters need it; cached per failure
    if tb:
        hdrs[H.ERROR_TRACEBACK] = tb[-policy.max_traceback :]
    _forget_restamp(t, hdrs)
    return hdrs


def _forget_restamp(t: Tracked, hdrs: dict[str, Any]) -> None:
    """A restamp copy's id names that copy only: later copies of it leave it off."""
    if t.headers and H.RESTAMP_ID in t.headers:
        hdrs[H.RESTAMP_ID] = None


def restamp_headers(t: Tracked, restamp_id: str) -> dict[str, Any]:
    """A redelivered `t` going back to its queue: the copy starts at this attempt."""
    hdrs: dict[str, Any] = {
        H.ATTEMPT: t.attempt,
        H.X_DELIVERY_COUNT: None,
        H.RESTAMP_ID: restamp_id,
    }
    _origin(t, hdrs)
    return hdrs
