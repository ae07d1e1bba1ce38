"""What the pages show, as plain values: bodies, header values, times, the chart.

No HTML here: the templates escape everything they print (Jinja autoescape);
this module only decides what text to show.
"""

from __future__ import annotations

import base64
import datetime as _dt
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .._connection.url import mask_url
from .._core import headers as H
from .._sync._pika import PROPERTY_FIELDS

BODY_SHOWN = 64 * 1024
"""Bytes of a body shown on a dead letter's page (the export has all of it)."""


@dataclass(frozen=True, slots=True)
class Body:
    kind: str
    """json, text or hex."""
    text: str
    size: int
    cut: bool


def body_view(body: bytes) -> Body:
    """The body as pretty JSON, else UTF-8 text, else a hex dump."""
    part = body[:BODY_SHOWN]
    cut = len(body) > BODY_SHOWN
    try:
        text = part.decode("utf-8")
    except UnicodeDecodeError:
        if not cut:
            return Body("hex", _hexdump(part), len(body), cut)
        try:  # a multi-byte character cut at the edge
            text = body[: BODY_SHOWN + 3].decode("utf-8", "strict")[: len(part)]
        except UnicodeDecodeError:
            return Body("hex", _hexdump(part), len(body), cut)
    if not cut:
        try:
            return Body(
                "json", json.dumps(json.loads(text), indent=2, ensure_ascii=False), len(body), cut
            )
        except ValueError:
            pass
    return Body("text", text, len(body), cut)


def _hexdump(data: bytes) -> str:
    lines = []
    for off in range(0, len(data), 16):
        chunk = data[off : off + 16]
        asc = "".join(chr(b) if 32 <= b < 127 else "." for b in chunk)
        lines.append(f"{off:08x}  {chunk.hex(' '):<47}  {asc}")
    return "\n".join(lines)


def value_text(value: Any, limit: int = 4_000) -> str:
    """A header or property value as display text (bytes decoded, tables as JSON)."""
    if isinstance(value, bytes):
        text = value.decode("utf-8", "backslashreplace")
    elif isinstance(value, str):
        text = value
    elif isinstance(value, (Mapping, list, tuple)):
        text = json.dumps(value, default=_jsonable, ensure_ascii=False)
    elif isinstance(value, _dt.datetime):
        text = value.isoformat()
    else:
        text = repr(value)
    text = mask_url(text)
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} characters)"


def _jsonable(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode("utf-8", "backslashreplace")
    if isinstance(value, _dt.datetime):
        return value.isoformat()
    return repr(value)


def properties(props: Any) -> list[tuple[str, str]]:
    """The message's basic properties that are set (headers apart)."""
    out = []
    for name in PROPERTY_FIELDS:
        if name == "headers":
            continue
        v = getattr(props, name, None)
        if v is not None:
            out.append((name, value_text(v)))
    return out


def headers(props: Any) -> list[tuple[str, str]]:
    h = getattr(props, "headers", None)
    if not isinstance(h, Mapping):
        return []
    return sorted((str(k), value_text(v)) for k, v in h.items() if k != H.ERROR_TRACEBACK)


def traceback_text(props: Any) -> str | None:
    h = getattr(props, "headers", None)
    if not isinstance(h, Mapping) or h.get(H.ERROR_TRACEBACK) is None:
        return None
    return value_text(h[H.ERROR_TRACEBACK], limit=64_000)


def when(ts: float | None) -> str:
    if ts is None:
        return "-"
    return _dt.datetime.fromtimestamp(ts, _dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


@dataclass(frozen=True, slots=True)
class Bar:
    x: float
    height: float
    count: int
    label: str


_STEPS = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200)
_DAY = 86400


def _step(lo: int, hi: int, bars: int) -> int:
    """Seconds per bar: the smallest round step whose bars (aligned to the step) show
    the seconds lo to hi in at most `bars` bars."""
    for s in _STEPS:
        if hi // s - lo // s < bars:
            return s
    days = 1
    while hi // (_DAY * days) - lo // (_DAY * days) >= bars:
        days += 1
    return _DAY * days


def _duration(seconds: int) -> str:
    for unit, name in ((_DAY, "day"), (3600, "hour"), (60, "minute"), (1, "second")):
        if seconds % unit == 0:
            n = seconds // unit
            return f"{n} {name}{'s' if n != 1 else ''}"
    return f"{seconds} seconds"  # pragma: no cover - 1 divides everything


def chart(
    seconds: Mapping[int, int], bars: int = 48, height: float = 60.0
) -> tuple[str, list[Bar]]:
    """Failures over time, from the first failure held to the last: (what one bar
    covers, the bars). O(distinct seconds), not O(dead letters)."""
    if not seconds:
        return "", []
    lo, hi = min(seconds), max(seconds)
    step = _step(lo, hi, bars)
    lo -= lo % step
    counts = [0] * ((hi - lo) // step + 1)
    for second, n in seconds.items():
        counts[(second - lo) // step] += n
    top = max(counts)
    out = []
    for i, n in enumerate(counts):
        label = f"{when(lo + i * step)}: {n} failure{'s' if n != 1 else ''}"
        out.append(Bar(i * 6.0, round(height * n / top, 1) if top else 0, n, label))
    return _duration(step), out


def export_line(entry: Any) -> str:
    """One JSON line: what the dead letter says, its properties, headers and body."""
    body: bytes = entry.body
    try:
        body_out: dict[str, str] = {"text": body.decode("utf-8")}
    except UnicodeDecodeError:
        body_out = {"base64": base64.b64encode(body).decode("ascii")}
    h = getattr(entry.props, "headers", None)
    return json.dumps(
        {
            "queue": entry.dlq,
            "dead_letter": entry.dl.to_dict(),
            "properties": {k: v for k, v in properties(entry.props)},
            "headers": {str(k): _jsonable_deep(v) for k, v in (h or {}).items()},
            "body": body_out,
        },
        ensure_ascii=False,
        default=_jsonable,
    )


def _jsonable_deep(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _jsonable_deep(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable_deep(v) for v in value]
    if isinstance(value, (bytes, _dt.datetime)):
        return _jsonable(value)
    return value
