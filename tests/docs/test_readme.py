"""README.md is the front door: under 12 KB, the two commands for trying ackkit from a
checkout on its first screen, and every link into the docs resolves."""

from __future__ import annotations

import re

from ._blocks import ROOT


def test_the_readme_is_short() -> None:
    assert len((ROOT / "README.md").read_bytes()) < 12 * 1024


def test_make_demo_and_make_test_are_on_the_first_screen() -> None:
    first = (ROOT / "README.md").read_text().split("\n")[:40]
    assert any(line.startswith("$ make demo") for line in first)
    assert any(line.startswith("$ make test") for line in first)


def test_every_relative_link_resolves() -> None:
    text = (ROOT / "README.md").read_text()
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    missing = [link for link in links if "://" not in link and not (ROOT / link).exists()]
    assert links and not missing, missing
