"""Checks of option values: each raises TypeError / ValueError naming the option and the
value, at once, so that a wrong setting never reaches the broker."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, TypeVar

from .wire import encode_table

E = TypeVar("E")

MAX_NAME_BYTES = 255
"""AMQP short strings (queue names) hold at most 255 bytes."""
MAX_SHORT = 65535
"""AMQP unsigned shorts: prefetch_count, heartbeat, channel numbers."""
MAX_DELAY_SECONDS = (2**32 - 1) / 1000
"""The longest TTL RabbitMQ documents for a message (2^32 - 1 ms)."""


def integer(option: str, value: object, lo: int, hi: int | None = None) -> int:
    """An int (not a bool) in [lo, hi]."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{option} must be an int, got {value!r} ({type(value).__name__})")
    if value < lo or (hi is not None and value > hi):
        bound = f">= {lo}" if hi is None else f"between {lo} and {hi}"
        raise ValueError(f"{option} must be {bound}, got {value!r}")
    return value


def number(
    option: str, value: object, lo: float, hi: float | None = None, *, above: bool = False
) -> float:
    """A finite real number (not a bool) >= lo (> lo with above=True) and <= hi."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{option} must be a number, got {value!r} ({type(value).__name__})")
    f = float(value)
    if not math.isfinite(f):
        raise ValueError(f"{option} must be a finite number, got {value!r}")
    if f < lo or (above and f == lo) or (hi is not None and f > hi):
        low = f"> {lo:g}" if above else f">= {lo:g}"
        bound = low if hi is None else f"{low} and <= {hi:g}"
        raise ValueError(f"{option} must be {bound}, got {value!r}")
    return f


def flag(option: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{option} must be True or False, got {value!r}")
    return value


def text(option: str, value: object, *, empty: bool = False) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{option} must be a str, got {value!r} ({type(value).__name__})")
    if not empty and not value:
        raise ValueError(f"{option} must not be empty")
    return value


def enum(option: str, cls: type[E], value: object) -> E:
    """A member of `cls` (a str Enum), or its value as a string."""
    if isinstance(value, cls):
        return value
    try:
        return cls(value)  # type: ignore[call-arg]
    except ValueError:
        names = ", ".join(f"{cls.__name__}.{m.name}" for m in cls)  # type: ignore[attr-defined]
        raise ValueError(f"{option} must be one of {names}, got {value!r}") from None


def queue_name(option: str, value: object, *, declared: bool = True) -> str:
    """A queue name the broker takes: non-empty (a server-named queue would be a new one at
    every start), at most 255 bytes of UTF-8, no control characters, and, for a queue
    ackkit declares, not under the broker's reserved `amq.` prefix."""
    name = text(option, value)
    try:
        size = len(name.encode("utf-8"))
    except UnicodeEncodeError:
        raise ValueError(f"{option} {name!r} is not encodable as UTF-8") from None
    if size > MAX_NAME_BYTES:
        raise ValueError(
            f"{option} {short(name)} is {size} bytes of UTF-8; AMQP queue names hold at "
            f"most {MAX_NAME_BYTES}"
        )
    bad = next((c for c in name if ord(c) < 32 or ord(c) == 127), None)
    if bad is not None:
        raise ValueError(f"{option} {name!r} contains the control character {bad!r}")
    if declared and name.startswith("amq."):
        raise ValueError(
            f"{option} {name!r}: the 'amq.' prefix is reserved by the broker, which refuses "
            "to declare such a queue"
        )
    return name


def exception_types(option: str, value: object) -> tuple[type[BaseException], ...]:
    """An exception class, or a tuple / list of them, as a tuple."""
    items = tuple(value) if isinstance(value, (tuple, list)) else (value,)
    for t in items:
        if not (isinstance(t, type) and issubclass(t, BaseException)):
            raise TypeError(
                f"{option} must be an exception class or a tuple of them, got {t!r} in {value!r}"
            )
    return items


_AMQP_SCALARS = (str, bytes, bytearray, int, float, bool, type(None))


def amqp_table(option: str, value: object) -> dict[str, Any]:
    """A dict with str keys and values AMQP field tables can carry: of AMQP's types, and
    encodable (a key over 255 bytes of UTF-8, an int past 64 bits, a lone surrogate, a
    table that contains itself fail here, not when the broker is sent it)."""
    try:
        out = _table(option, value)
    except RecursionError:
        raise ValueError(f"{option} is nested too deeply (or contains itself)") from None
    if out:
        try:
            encode_table(out)
        except RecursionError:
            raise ValueError(f"{option} is nested too deeply (or contains itself)") from None
        except Exception as exc:  # EncodeError, or struct's error for an out-of-range value
            raise ValueError(f"{option} cannot be sent in an AMQP table: {exc}") from None
    return out


def _table(option: str, value: object) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise TypeError(f"{option} must be a dict, got {value!r} ({type(value).__name__})")
    out: dict[str, Any] = {}
    for k, v in value.items():
        if not isinstance(k, str):
            raise TypeError(f"{option}: keys must be str, got {k!r}")
        _amqp_value(f"{option}[{k!r}]", v)
        out[k] = v
    return out


def _amqp_value(option: str, v: object) -> None:
    if isinstance(v, float) and not math.isfinite(v):
        raise ValueError(f"{option} must be finite, got {v!r}")
    if isinstance(v, _AMQP_SCALARS):
        return
    if isinstance(v, Mapping):
        _table(option, v)
        return
    if isinstance(v, (list, tuple)):
        for i, item in enumerate(v):
            _amqp_value(f"{option}[{i}]", item)
        return
    import datetime
    import decimal

    if isinstance(v, (datetime.datetime, decimal.Decimal)):
        return
    raise TypeError(f"{option}: {v!r} ({type(v).__name__}) cannot be sent in an AMQP table")


def short(s: str) -> str:
    return repr(s) if len(s) <= 60 else repr(s[:40] + "...") + f" ({len(s)} characters)"
