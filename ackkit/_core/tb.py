"""The text of a handler's exception: its traceback for dead letters (formatted once per
distinct failure), its message, its type name, bounded for headers and log lines.

A poison flood fails thousands of deliveries at the same line with the same
error; Python's traceback formatting (source lines, 3.11+ caret anchors parsed
with ast) then costs more than the rest of dead-lettering. The text depends
only on the frames' code locations and the exceptions' types and messages, so
it is cached by exactly those.
"""

from __future__ import annotations

import threading
import traceback
from collections import OrderedDict

_LOCK = threading.Lock()  # listeners of one process share the cache
_CACHE: OrderedDict[tuple[object, ...], str] = OrderedDict()
_CACHE_SIZE = 256
_MAX_CHAIN = 16


def _key(exc: BaseException) -> tuple[object, ...]:
    parts: list[object] = []
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen and len(seen) < _MAX_CHAIN:
        seen.add(id(e))
        frames: list[object] = []
        tb = e.__traceback__
        while tb is not None:
            co = tb.tb_frame.f_code
            frames.append((co.co_filename, co.co_name, tb.tb_lineno, tb.tb_lasti))
            tb = tb.tb_next
        cause = e.__cause__
        context = None if e.__suppress_context__ else e.__context__
        parts.append((type(e), text_of(e), tuple(frames), cause is not None, context is not None))
        e = cause if cause is not None else context
    return tuple(parts)


def _format(exc: BaseException) -> str:
    """Python's traceback text of `exc`; when that fails (an exception in the chain whose
    str() raises a BaseException, which the traceback module does not catch), its frames
    and the exception described by `text_of`."""
    try:
        return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    except BaseException:  # a hostile __str__ / __repr__ may raise anything
        try:
            frames = "".join(traceback.format_tb(exc.__traceback__))
        except BaseException:
            frames = ""
        return f"Traceback (most recent call last):\n{frames}{type(exc).__name__}: {text_of(exc)}\n"


def format_traceback(exc: BaseException) -> str:
    """The standard traceback text of `exc` (with its chain), cached per distinct failure.
    Never raises, whatever the exception's str() does."""
    try:
        key = _key(exc)
        hash(key)
    except Exception:  # unhashable parts
        return _format(exc)
    with _LOCK:
        text = _CACHE.get(key)
        if text is not None:
            _CACHE.move_to_end(key)
            return text
    text = _format(exc)
    with _LOCK:
        _CACHE[key] = text
        if len(_CACHE) > _CACHE_SIZE:
            _CACHE.popitem(last=False)
    return text


def text_of(exc: BaseException) -> str:
    """str(exc), for any exception a handler may raise: one whose __str__ raises (or
    returns something that is not a str) is described by its type instead."""
    try:
        text = str(exc)
    except BaseException:  # a hostile __str__ may raise anything
        return f"<{type(exc).__name__}: str() failed>"
    return text if isinstance(text, str) else f"<{type(exc).__name__}>"


def qualname(exc: BaseException) -> str:
    """The exception's type as `module.Qualname` (builtins without their module)."""
    t = type(exc)
    mod = t.__module__
    return t.__qualname__ if mod == "builtins" else f"{mod}.{t.__qualname__}"


def bounded(s: str, n: int) -> str:
    """`s`, at most `n` characters ('...' marks a cut)."""
    return s if len(s) <= n else s[: n - 3] + "..."


def describe(exc: BaseException, *, qualified: bool = False) -> str:
    """`Type: message` in at most about 200 characters, for events and reasons; a
    dead letter's reason names the type `qualified`, as its ackkit-error-type does."""
    kind = qualname(exc) if qualified else type(exc).__name__
    return f"{kind}: {bounded(text_of(exc), 200)}"
