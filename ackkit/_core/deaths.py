"""The broker's death records (`x-death`), read whatever shape they arrive in.

RabbitMQ writes `x-death` as an array of tables, the most recent death first,
each naming the `queue` the message died in. A dead letter that went through
other hands (a shovel, a script, a client that rebuilt its headers, RabbitMQ
before 4.0 continuing a publisher's own `x-death`) may carry a damaged one: a
table on its own instead of an array, tables wrapped in another array, junk
entries, fields of the wrong type. Whatever is usable is used: the tables are
found wherever they sit (`tables`), and the queue the most recent usable
record names is the dead letter's origin (`death_queue`).

No I/O; total: nothing here raises on a header value of any shape or size.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

NAME_MAX = 255
"""Bytes in an AMQP queue, exchange or routing-key name (a short string)."""
MAX_DEPTH = 4
"""Arrays nested this deep around a table are still looked into (the broker writes 1)."""
MAX_ITEMS = 10_000
"""Values looked at in one x-death at most: a huge one costs bounded time."""

QUEUE_FALLBACKS = ("x-last-death-queue", "x-first-death-queue")
"""Headers the broker also writes (3.10+), read when no x-death table names a queue."""


def queue_name(value: Any) -> tuple[str | None, str | None]:
    """(name, None) when `value` is a name the broker could route by (text, or UTF-8
    bytes, of at most 255 bytes without control characters), else (None, why not);
    (None, None) for None. "" is returned as it is: it names the default exchange, and
    no queue."""
    if value is None:
        return None, None
    if isinstance(value, (bytes, bytearray)):
        try:
            value = bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            return None, "invalid UTF-8"
    if not isinstance(value, str):
        return None, type(value).__name__
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        return None, "unencodable text"
    if size > NAME_MAX:
        return None, f"{size} bytes, at most {NAME_MAX}"
    if any(ord(c) < 32 or ord(c) == 127 for c in value):
        return None, "control characters"  # ackkit refuses such queue names itself
    return value, None


def tables(deaths: Any) -> tuple[list[Mapping[Any, Any]], int]:
    """The tables in an x-death value, most recent first, and how many other values
    were passed over. An array of tables (the broker's shape), a table on its own, and
    tables inside arrays nested up to MAX_DEPTH deep all count; anything else is junk."""
    found: list[Mapping[Any, Any]] = []
    junk = 0
    for v in _walk(deaths):
        if isinstance(v, Mapping):
            found.append(v)
        else:
            junk += 1
    return found, junk


def _walk(value: Any) -> Iterator[Any]:
    """The values of `value` in order, arrays flattened up to MAX_DEPTH; at most MAX_ITEMS."""
    if value is None:
        return
    budget = MAX_ITEMS
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack and budget > 0:
        v, depth = stack.pop()
        budget -= 1
        if isinstance(v, (list, tuple)) and depth < MAX_DEPTH:
            try:
                items = list(v[:budget])
            except Exception:  # a hostile sequence
                yield v
                continue
            stack.extend((x, depth + 1) for x in reversed(items))
        else:
            yield v


def last_death(deaths: Any) -> tuple[Mapping[Any, Any] | None, str | None]:
    """The most recent death record (the first table found) and a note on what was
    passed over to find it, or why there is none (None: nothing to say)."""
    if deaths is None:
        return None, None
    found, junk = tables(deaths)
    if not found:
        return None, f"no table in {_what(deaths)}"
    if isinstance(deaths, Mapping):
        return found[0], "a table where a list of tables belongs"
    if junk:
        return found[0], f"{junk} entr{'y' if junk == 1 else 'ies'} not a table, passed over"
    if any(not isinstance(d, Mapping) for d in _top(deaths)):
        return found[0], "tables nested in a list, read all the same"
    return found[0], None


def _top(deaths: Any) -> list[Any]:
    try:
        return list(deaths[:MAX_ITEMS]) if isinstance(deaths, (list, tuple)) else []
    except Exception:
        return []


def _what(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return f"a list of {len(value)}"
    return f"a value of type {type(value).__name__}"


def death_queue(headers: Mapping[Any, Any]) -> str | None:
    """The queue the most recent usable death record names, whatever garbage is next
    to it: each x-death table's `queue` (most recent first), then x-last-death-queue and
    x-first-death-queue. None when none of them is a usable name."""
    try:
        found, _ = tables(headers.get("x-death"))
        for t in found:
            q, _why = queue_name(t.get("queue"))
            if q:
                return q
        for key in QUEUE_FALLBACKS:
            q, _why = queue_name(headers.get(key))
            if q:
                return q
    except Exception:  # a hostile mapping: no origin from it
        return None
    return None
