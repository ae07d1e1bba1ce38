"""Checks of listener(...) options that build plain values: queue arguments, flow
options, consumer arguments. Pure functions, no I/O; `AppBase.listener` calls them."""

from __future__ import annotations

from typing import Any

from ._core import checks as C
from ._core.flow import CircuitBreaker, FlowPolicy, RateLimit, SerialKey
from ._core.policy import AckMode

_DAY = 86_400.0


def queue_type(arguments: dict[str, Any] | None) -> str | None:
    value = (arguments or {}).get("x-queue-type")
    return None if value is None else str(value)


def check_queue_arguments(queue: str, args: dict[str, Any], mode: AckMode) -> None:
    """Arguments that contradict how ackkit consumes the queue."""
    qtype = args.get("x-queue-type")
    if qtype is not None and qtype not in ("classic", "quorum"):
        why = ""
        if qtype == "stream":
            why = ": a stream keeps messages after their ack, ackkit's settling does not apply"
        raise ValueError(
            f"queue_arguments['x-queue-type'] must be 'classic' or 'quorum', got {qtype!r}{why}"
        )
    for key in (
        "x-message-ttl",
        "x-expires",
        "x-max-length",
        "x-max-length-bytes",
        "x-delivery-limit",
        "x-max-priority",
    ):
        if key in args:
            C.integer(f"queue_arguments[{key!r}]", args[key], 0)
    if "x-single-active-consumer" in args:
        C.flag("queue_arguments['x-single-active-consumer']", args["x-single-active-consumer"])
    if args.get("x-dead-letter-routing-key") == queue and args.get("x-dead-letter-exchange") == "":
        raise ValueError(
            f"queue_arguments dead-letter {queue!r} into itself "
            "(x-dead-letter-exchange '' and x-dead-letter-routing-key the queue): "
            "every rejected message would come straight back"
        )


_CONSUMER_NAMED = {"x-priority": "consumer_priority", "x-consumer-timeout": "consumer_timeout"}
_INT32 = 2**31 - 1


def flow_policy(
    breaker: CircuitBreaker | None,
    rate: RateLimit | float | None,
    serial: SerialKey | None,
    batch_size: int | None,
) -> FlowPolicy | None:
    """The listener's flow options as one value (None when all are off)."""
    if rate is not None and not isinstance(rate, RateLimit):
        if isinstance(rate, bool) or not isinstance(rate, (int, float)):
            raise TypeError(
                f"rate_limit must be a RateLimit, a number of messages per second or None, "
                f"got {rate!r}"
            )
        rate = RateLimit(float(rate))
    if serial is not None and batch_size is not None:
        raise ValueError(
            "serial_key= with batch_size=: a batch would run deliveries of one key together "
            "and out of the gate's order; use one or the other"
        )
    if breaker is None and rate is None and serial is None:
        return None
    return FlowPolicy(breaker=breaker, rate_limit=rate, serial_key=serial)


def consumer_arguments(
    priority: int | None, timeout: float | None, extra: dict[str, Any] | None
) -> dict[str, Any]:
    """basic.consume arguments from the named options and `consumer_arguments`."""
    args = C.amqp_table("consumer_arguments", extra)
    for key, option in _CONSUMER_NAMED.items():
        if key in args:
            raise ValueError(f"consumer_arguments[{key!r}]: use {option}= instead")
    if priority is not None:
        args["x-priority"] = C.integer("consumer_priority", priority, -_INT32 - 1, _INT32)
    if timeout is not None:
        seconds = C.number("consumer_timeout", timeout, 0, _DAY * 7, above=True)
        args["x-consumer-timeout"] = max(1, round(seconds * 1000))  # milliseconds
    return args


def check_inbox(inbox: object, mode: AckMode, batch_size: int | None) -> None:
    """listener(inbox=...): an `ackkit.inbox.Inbox`, with a listener it can guard."""
    from .inbox import Inbox

    if not isinstance(inbox, Inbox):
        raise TypeError(f"inbox must be an ackkit.inbox.Inbox or None, got {inbox!r}")
    if mode is not AckMode.AUTO:
        raise ValueError(
            f"inbox= needs ack_mode=AckMode.AUTO, got {mode}: the ack must follow the "
            "transaction's commit, so ackkit settles, not the handler"
        )
    if batch_size is not None:
        raise ValueError("inbox= with batch_size= is not supported yet: one message a transaction")
