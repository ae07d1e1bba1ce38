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

from .._core import headers as H
from .._sync._pika import PROPERTY_FIELDS
from .._url import mask_url

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
    return _dt.datetime.fromtimestamp(ts, _dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


@dataclass(frozen=True, slots=True)
class Bar:
    x: float
    height: float
    count: int
    label: str


def chart(minutes: Mapping[int, int], bars: int = 40, height: float = 60.0) -> list[Bar]:
    """Failures over time as at most `bars` bars (from the first failure held to the last),
    each bar one or more whole minutes."""
    if not minutes:
        return []
    lo, hi = min(minutes), max(minutes)
    span = hi - lo + 1
    width = -(-span // bars)  # minutes per bar
    counts = [0] * (-(-span // width))
    for minute, n in minutes.items():
        counts[(minute - lo) // width] += n
    top = max(counts)
    out = []
    for i, n in enumerate(counts):
        start = (lo + i * width) * 60
        label = f"{when(start)}: {n} failure{'s' if n != 1 else ''}"
        if width > 1:
            label += f" in {width} minutes"
        out.append(Bar(i * 6.0, round(height * n / top, 1) if top else 0, n, label))
    return out


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
