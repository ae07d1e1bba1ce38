"""listener(...)'s old flat options, translated into the grouped values (`Queue`,
`Consumer`, `Batch`, `Flow`) with a DeprecationWarning naming the new spelling; and the
inbox check. Pure functions, no I/O; `AppBase.listener` calls them."""

from __future__ import annotations

import warnings
from typing import Any

from .._core.policy import AckMode
from .listener_values import Batch, Consumer, Flow, Queue

# old option -> (group, field in the group's value)
DEPRECATED: dict[str, tuple[str, str]] = {
    "prefetch": ("consumer", "prefetch"),
    "concurrency": ("consumer", "concurrency"),
    "max_concurrency": ("consumer", "concurrency"),
    "exclusive": ("consumer", "exclusive"),
    "consumer_priority": ("consumer", "priority"),
    "consumer_timeout": ("consumer", "timeout"),
    "consumer_arguments": ("consumer", "arguments"),
    "flush": ("consumer", "flush"),
    "max_body_size": ("consumer", "max_body_size"),
    "check_content_type": ("consumer", "check_content_type"),
    "declare": ("queue", "declare"),
    "queue_arguments": ("queue", "arguments"),
    "bind": ("queue", "bind"),
    "batch_size": ("batch", "size"),
    "batch_timeout": ("batch", "timeout"),
    "circuit_breaker": ("flow", "circuit_breaker"),
    "rate_limit": ("flow", "rate_limit"),
    "serial_key": ("flow", "serial_key"),
}
_VALUE = {"consumer": "Consumer", "queue": "Queue", "batch": "Batch", "flow": "Flow"}


def new_spelling(option: str) -> str:
    """How an old flat option is written now, e.g. `consumer=Consumer(prefetch=...)`."""
    group, name = DEPRECATED[option]
    if group == "queue":
        return f"listener(Queue(name, {name}=...))"
    return f"listener({group}={_VALUE[group]}({name}=...))"


def translate(
    queue: str | Queue,
    consumer: Consumer | None,
    batch: Batch | None,
    flow: Flow | None,
    legacy: dict[str, Any],
) -> tuple[Queue, Consumer, Batch | None, Flow]:
    """The grouped values from the new ones and the old flat options in `legacy`
    (warning once for each old option; `stacklevel` points at the listener() call)."""
    unknown = sorted(set(legacy) - set(DEPRECATED))
    if unknown:
        raise TypeError(f"listener() got an unexpected keyword argument {unknown[0]!r}")
    groups: dict[str, dict[str, Any]] = {"consumer": {}, "queue": {}, "batch": {}, "flow": {}}
    for option, value in legacy.items():
        warnings.warn(
            f"listener({option}=...) is deprecated, use {new_spelling(option)}",
            DeprecationWarning,
            stacklevel=3,
        )
        group, name = DEPRECATED[option]
        groups[group][name] = value
    given: dict[str, object] = {"consumer": consumer, "batch": batch, "flow": flow}
    given["queue"] = queue if isinstance(queue, Queue) else None
    for group, old in groups.items():
        if old and given[group] is not None:
            first = next(o for o in legacy if DEPRECATED[o][0] == group)
            raise TypeError(
                f"listener(): {first}= and {group}= both given; put it in "
                f"{new_spelling(first).removeprefix('listener(')[:-1]}"
            )
    if "max_concurrency" in legacy and "concurrency" in legacy:
        Consumer(concurrency=legacy["concurrency"])  # checked, then max_concurrency wins
        groups["consumer"]["concurrency"] = legacy["max_concurrency"]
    q = queue if isinstance(queue, Queue) else Queue(queue, **groups["queue"])
    c = consumer if consumer is not None else Consumer(**groups["consumer"])
    if batch is None and groups["batch"]:
        if "size" not in groups["batch"]:
            Batch(1, **groups["batch"])  # checked; without batch_size it never applied
        else:
            batch = Batch(**groups["batch"])
    f = flow if flow is not None else Flow(**groups["flow"])
    for name, value, cls in (("consumer", c, Consumer), ("batch", batch, Batch), ("flow", f, Flow)):
        if value is not None and not isinstance(value, cls):
            raise TypeError(f"{name} must be a {cls.__name__} or None, got {value!r}")
    return q, c, batch, f


def check_inbox(inbox: object, mode: AckMode, batch: Batch | None = None) -> None:
    """listener(inbox=...): an `ackkit.inbox.Inbox`, with a listener it can guard."""
    from ..inbox import Inbox

    if not isinstance(inbox, Inbox):
        raise TypeError(f"inbox must be an ackkit.inbox.Inbox or None, got {inbox!r}")
    if mode is not AckMode.AUTO:
        raise ValueError(
            f"inbox= needs ack_mode=AckMode.AUTO, got {mode}: the ack must follow the "
            "transaction's commit, so ackkit settles, not the handler"
        )
    # batch=: one transaction per batch (see `_core.inbox.end_batch`)
