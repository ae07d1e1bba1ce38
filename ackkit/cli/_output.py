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


DEAD_LETTER_FIELDS = (
    "message_id",
    "attempts",
    "error_type",
    "reason",
    "original_queue",
    "dead_lettered_at",
    "notes",
    "error_message",
)
"""`ackkit dlq inspect`'s TSV columns, in order (error_message came last, so the fields
scripts cut by position kept their place)."""

_ID, _ATTEMPTS, _TYPE, _REASON, _QUEUE, _AT, _NOTES, _MESSAGE = range(len(DEAD_LETTER_FIELDS))

READABLE_ID = 13
"""Characters of a message id the table keeps at least, when it has to cut one."""
READABLE_TEXT = 40
"""Characters of a reason or an error that read, when not every one can be whole."""
LEFT_OUT = ("attempts", "dead-lettered", "queue", "notes")
"""The table's columns it leaves out, in this order, so the reason and error read whole."""


@dataclass(frozen=True)
class DeadLetterTable:
    """`dlq inspect`'s table: what it shows and what it left out to fit."""

    columns: list[Column]
    cells: list[list[object]]
    queue: str | None = None
    """The origin queue of every row, when it is one (named once above the table)."""
    left_out: tuple[str, ...] = ()
    """Columns left out so that the reason and the error read whole."""

    def render(self, width: int) -> str:
        """The table, then what was left out (each line at most `width` cells)."""
        text = table(self.columns, self.cells, width)
        if self.left_out:
            note = f"(left out to fit: {', '.join(self.left_out)}; --format json has all)"
            text += note[: max(width, 1)] + "\n"
        return text


_Col = tuple[str, Column, int | None]
"""A column of `dlq inspect`'s table: its name, how it is shown, its field (None: error)."""
_DEAD_LETTER_COLUMNS: tuple[_Col, ...] = (
    ("message_id", Column("message_id", 8), _ID),
    ("attempts", Column("attempts", 3, numeric=True), _ATTEMPTS),
    ("reason", Column("reason", 12), _REASON),
    ("error", Column("error", 12), None),
    ("queue", Column("queue", 5), _QUEUE),
    ("dead-lettered", Column("dead-lettered", 8), _AT),
    ("notes", Column("notes", 5), _NOTES),
)


@dataclass(frozen=True)
class _Layout:
    columns: list[_Col]
    short_types: bool
    cut_ids: bool
    left_out: tuple[str, ...]


def dead_letter_table(rows: Sequence[Sequence[object]], width: int) -> DeadLetterTable:
    """`dlq inspect`'s table for `rows` (values in DEAD_LETTER_FIELDS order), made to read
    at `width` cells (80 is the usual terminal): one line per dead letter with its reason
    and its error (`Type: message`, the type qualified as in ackkit-error-type) whole.

    A column empty in every row is left out, and the origin queue when every row shares
    it (named above the table instead); the time reads MM-DD HH:MM:SS. Then, until the
    reason and error read whole: the error type goes down to its last part, a message id
    to its first READABLE_ID characters, and the columns of LEFT_OUT go, one at a time.
    When nothing lets every reason and error read whole, the first layout that shows
    READABLE_TEXT characters of each, else the narrowest, is cut with ellipses. TSV and
    JSON keep every field whole."""
    rows = [list(r) + [None] * (len(DEAD_LETTER_FIELDS) - len(r)) for r in rows]
    queues = {r[_QUEUE] for r in rows}
    shared = next(iter(queues)) if len(queues) == 1 and rows else None
    present = [
        c
        for c in _DEAD_LETTER_COLUMNS
        if c[0] == "reason" or any(_value(r, c[2], False) is not None for r in rows)
    ]
    if shared is not None:
        present = [c for c in present if c[0] != "queue"]
    optional = [n for n in LEFT_OUT if any(c[0] == n for c in present)]
    layouts = [
        _Layout([c for c in present if c[0] not in optional[:k]], short, cut, tuple(optional[:k]))
        for k in range(len(optional) + 1)
        for short in (False, True)
        for cut in (False, True)
    ]
    cells = {id(lo): _cells(rows, lo) for lo in layouts}
    chosen = (
        next((lo for lo in layouts if _reads(lo, cells[id(lo)], width, None)), None)
        or next((lo for lo in layouts if _reads(lo, cells[id(lo)], width, READABLE_TEXT)), None)
        or layouts[-1]
    )
    return DeadLetterTable(
        [c for _n, c, _i in chosen.columns],
        cells[id(chosen)],
        str(shared) if shared is not None else None,
        chosen.left_out,
    )


def _value(r: Sequence[object], index: int | None, short: bool) -> object:
    """A cell's value: the field at `index`, the time shortened, or the error."""
    if index is not None:
        return _short_time(r[index]) if index == _AT else r[index]
    kind, msg = r[_TYPE], r[_MESSAGE]
    if kind is not None and short:
        kind = str(kind).rsplit(".", 1)[-1]
    parts = [str(p) for p in (kind, msg) if p is not None and p != ""]
    return ": ".join(parts) or None


def _cells(rows: Sequence[Sequence[object]], lo: _Layout) -> list[list[object]]:
    out = [[_value(r, i, lo.short_types) for _n, _c, i in lo.columns] for r in rows]
    if lo.cut_ids and lo.columns and lo.columns[0][0] == "message_id":
        for r in out:
            if r[0] is not None:
                r[0] = _cut(_cell(r[0]), READABLE_ID)
    return out


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "\u2026"


def _cell(v: object) -> str:
    return _one_line("-" if v is None else str(v))


def _reads(lo: _Layout, values: Sequence[Sequence[object]], width: int, least: int | None) -> bool:
    """Whether, at `width`, every reason and error cell is whole (`least` None) or shows
    at least `least` characters, and a message id READABLE_ID characters."""
    from rich.cells import cell_len

    cells = [[_cell(v) for v in r] for r in values]
    natural = [
        max([cell_len(c.name)] + [cell_len(r[i]) for r in cells])
        for i, (_n, c, _x) in enumerate(lo.columns)
    ]
    available = max(len(lo.columns), width - GAP * (len(lo.columns) - 1))
    widths = fit_widths(natural, [c.min_width for _n, c, _i in lo.columns], available)
    for (name, _c, _i), w, n in zip(lo.columns, widths, natural, strict=True):
        if name in ("reason", "error") and w < (n if least is None else min(n, least)):
            return False
        if name == "message_id" and w < min(n, READABLE_ID):
            return False
    return True


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
