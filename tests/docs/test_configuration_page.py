"""The Configuration page's tables are checked against the code: they list exactly the
keyword parameters of App / AsyncApp, of @app.listener and of its values (Queue,
Consumer, Batch, Flow) and the fields of Retry, and a default the page shows as a
plain value is the signature's default."""

from __future__ import annotations

import enum
import inspect
import re
from typing import Any

import pytest

from ackkit import App, AsyncApp, Batch, Consumer, Flow, Queue, Retry

from ._blocks import DOCS

PAGE = DOCS / "reference" / "configuration.md"


def tables() -> list[dict[str, str]]:
    """Each table of the page as {option name: default cell}."""
    out: list[dict[str, str]] = []
    for block in re.findall(r"(?:^\|.*\n)+", PAGE.read_text(), re.M):
        rows = block.strip().split("\n")[2:]
        table: dict[str, str] = {}
        for row in rows:
            cells = [c.strip() for c in row.strip("|").split("|")]
            names = re.findall(r"`(\w+)`", cells[0])
            defaults = [d.strip() for d in cells[1].split(",")] if len(names) > 1 else [cells[1]]
            for i, name in enumerate(names):
                table[name] = defaults[i] if i < len(defaults) else ""
        out.append(table)
    return out


def params(fn: Any, skip: tuple[str, ...] = ()) -> dict[str, Any]:
    return {
        n: p.default
        for n, p in inspect.signature(fn).parameters.items()
        if n not in ("self", *skip)
    }


def shown_value(cell: str) -> tuple[bool, Any]:
    """(True, value) when the cell is a plain value this test can compare."""
    cell = cell.strip("`")
    if cell == "none":
        return True, None
    if cell in ("True", "False"):
        return True, cell == "True"
    if re.fullmatch(r"-?\d+(\.\d+)?", cell):
        return True, float(cell)
    if re.fullmatch(r'"[^"{}]*"', cell):
        return True, cell[1:-1]
    if re.fullmatch(r"\w+\.\w+", cell):
        return True, cell
    return False, None


def same(shown: Any, default: Any) -> bool:
    if isinstance(default, enum.Enum):
        return shown == f"{type(default).__name__}.{default.name}"
    if isinstance(shown, float) and not isinstance(default, bool):
        return isinstance(default, int | float) and float(default) == shown
    return bool(shown == default)


@pytest.mark.parametrize(
    ("index", "fn", "skip"),
    [
        (0, App.__init__, ()),
        (1, App.listener, ("queue", "deprecated")),
        (2, Queue, ("name",)),
        (3, Consumer, ()),
        (4, Batch, ()),
        (5, Flow, ()),
        (6, Retry, ()),
    ],
    ids=["App", "listener", "Queue", "Consumer", "Batch", "Flow", "Retry"],
)
def test_a_table_lists_exactly_the_parameters(index: int, fn: Any, skip: tuple[str, ...]) -> None:
    table = tables()[index]
    code = params(fn, skip)
    assert set(table) == set(code)
    wrong = {}
    for name, cell in table.items():
        plain, value = shown_value(cell)
        if plain and not same(value, code[name]):
            wrong[name] = (cell, code[name])
    assert not wrong, f"defaults on the page differ from the code: {wrong}"


def test_async_app_takes_the_same_options() -> None:
    assert params(AsyncApp.__init__) == params(App.__init__)
    assert params(AsyncApp.listener) == params(App.listener)
