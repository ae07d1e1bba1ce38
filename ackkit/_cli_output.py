"""How the `ackkit` command prints rows: a table that fits the terminal, TSV, or JSON.

`--format auto` (the default) is a table on a terminal and TSV when the output
is piped or redirected, so `ackkit queues | sort -k2 -n` and `cut -f1` work. A
table keeps one line per row at any width: long cells end in an ellipsis (TSV
and JSON carry them whole). TSV escapes backslash, tab, newline and carriage
return as \\\\, \\t, \\n, \\r, so every row is one line of exactly as many fields
as the header.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any


class OutputFormat(str, Enum):
    """How a listing is printed."""

    AUTO = "auto"
    """TABLE on a terminal, TSV otherwise."""
    TABLE = "table"
    """A table that fits the terminal's width, one line per row."""
    TSV = "tsv"
    """Tab-separated values with a header line, for scripts."""
    JSON = "json"
    """One JSON document, every field whole."""


def resolve(fmt: OutputFormat, *, as_json: bool, tty: bool) -> OutputFormat:
    """The format to print in: --json wins (kept for scripts written before --format)."""
    if as_json:
        return OutputFormat.JSON
    if fmt is OutputFormat.AUTO:
        return OutputFormat.TABLE if tty else OutputFormat.TSV
    return fmt


def tsv_cell(value: object) -> str:
    """One TSV field: None is empty; \\, tab, newline and CR escaped."""
    if value is None:
        return ""
    text = str(value)
    return text.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n").replace("\r", "\\r")


def tsv(header: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """Header line and rows, tab-separated, each ending in a newline."""
    lines = ["\t".join(tsv_cell(h) for h in header)]
    lines += ["\t".join(tsv_cell(v) for v in row) for row in rows]
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class Column:
    """A table column (`min_width` is kept while the terminal is wide enough)."""

    name: str
    min_width: int = 4
    numeric: bool = False


GAP = 2
"""Spaces between two table columns."""


def fit_widths(natural: Sequence[int], mins: Sequence[int], available: int) -> list[int]:
    """Column widths that fit `available` cells: the natural ones when they fit, else
    the widest columns cut down to a common cap (never below their minimum while the
    minimums fit; below it, every column gets at least 1)."""
    nat = [max(1, n) for n in natural]
    if sum(nat) <= available:
        return nat
    floor = [min(m, n) for m, n in zip(mins, nat, strict=True)]
    if sum(floor) > available:
        floor = [1] * len(nat)
    lo, hi = 1, max(nat)  # the largest cap that fits
    while lo < hi:
        cap = (lo + hi + 1) // 2
        if sum(max(f, min(n, cap)) for n, f in zip(nat, floor, strict=True)) <= available:
            lo = cap
        else:
            hi = cap - 1
    return [max(f, min(n, lo)) for n, f in zip(nat, floor, strict=True)]


def table(columns: Sequence[Column], rows: Iterable[Sequence[object]], width: int) -> str:
    """A plain-text table no wider than `width`: a header, a rule, one line per row.
    Cells never wrap; a long one ends in an ellipsis (TSV and JSON carry it whole)."""
    from rich.cells import cell_len, set_cell_size

    cells = [[_one_line("-" if v is None else str(v)) for v in row] for row in rows]
    heads = [c.name for c in columns]
    natural = [max([cell_len(h)] + [cell_len(r[i]) for r in cells]) for i, h in enumerate(heads)]
    available = max(len(columns), width - GAP * (len(columns) - 1))
    widths = fit_widths(natural, [c.min_width for c in columns], available)

    def line(values: Sequence[str]) -> str:
        out = []
        for v, w, c in zip(values, widths, columns, strict=True):
            if cell_len(v) > w:
                v = set_cell_size(v, w - 1) + "\u2026" if w > 1 else "\u2026"
            pad = " " * (w - cell_len(v))
            out.append(pad + v if c.numeric else v + pad)
        return (" " * GAP).join(out).rstrip()

    lines = [line(heads), line(["-" * w for w in widths])]
    lines += [line(r) for r in cells]
    return "\n".join(lines) + "\n"


DEAD_LETTER_COLUMNS = (
    Column("message_id", 12),
    Column("attempts", 3, numeric=True),
    Column("error type", 10),
    Column("reason", 20),
    Column("queue", 5),
    Column("dead-lettered", 8),
    Column("notes", 5),
)
"""`ackkit dlq inspect`'s table: message id, attempts, error type, reason, original
queue, when (MM-DD HH:MM:SS, UTC), notes."""


def dead_letter_table(rows: Sequence[Sequence[object]]) -> tuple[list[Column], list[list[object]]]:
    """The columns and cells of `dlq inspect`'s table, made to read at 80 columns: the
    time without year and fraction, and a message-id or notes column that is empty in
    every row left out (TSV and JSON keep every field whole)."""
    cells = [[*r[:5], _short_time(r[5]), *r[6:]] for r in rows]
    keep = [
        i
        for i, c in enumerate(DEAD_LETTER_COLUMNS)
        if c.name not in ("message_id", "notes") or any(r[i] is not None for r in cells)
    ]
    return [DEAD_LETTER_COLUMNS[i] for i in keep], [[r[i] for i in keep] for r in cells]


def _short_time(value: object) -> object:
    """'2026-11-26T06:49:03.123+00:00' -> '11-26 06:49:03' (other values unchanged)."""
    text = str(value) if value is not None else ""
    if len(text) >= 19 and text[4] == "-" and text[10] in "T " and text[13] == ":":
        return f"{text[5:10]} {text[11:19]}"
    return value


def _one_line(text: str) -> str:
    return "".join(ch if ch.isprintable() else " " for ch in text)


def json_text(data: Any) -> str:
    return json.dumps(data, indent=2, default=str)
