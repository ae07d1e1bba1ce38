"""The extras table is shown twice (the README, the front door, and the Install page):
both are the same table, and it names every extra of pyproject.toml."""

from __future__ import annotations

import re

from ._blocks import DOCS, ROOT

TABLE = re.compile(r"\| extra \| adds \| for \|\n(?:\|.*\n)+")


def table(text: str) -> str:
    m = TABLE.search(text)
    assert m is not None
    return m.group(0)


def test_the_readme_and_the_install_page_show_the_same_extras_table() -> None:
    readme = table((ROOT / "README.md").read_text())
    install = table((DOCS / "getting-started" / "install.md").read_text())
    assert readme == install


def test_the_table_names_every_extra() -> None:
    pyproject = (ROOT / "pyproject.toml").read_text()
    section = pyproject.split("[project.optional-dependencies]")[1].split("\n[")[0]
    extras = re.findall(r"^(\w+) = \[", section, re.M)
    shown = set(re.findall(r"^\| `(\w+)` \|", table((ROOT / "README.md").read_text()), re.M))
    assert shown == set(extras)
