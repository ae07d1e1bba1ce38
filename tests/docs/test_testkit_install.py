"""ackkit-testkit is not on PyPI (nor is ackkit): every page that names it gives the
command that works, ``pip install /path/to/ackkit/testkit`` (the checkout's testkit/
directory, after ackkit), and none shows ``pip install ackkit-testkit``, which finds
nothing. The command is checked with pip itself, offline, on this checkout."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ackkit.testing import _kit

from ._blocks import ROOT, pages

WORKS = "pip install /path/to/ackkit/testkit"
FAILS = "pip install ackkit-testkit"


def naming_pages() -> list[Path]:
    candidates = [*pages(), ROOT / "testkit" / "README.md"]
    return [p for p in candidates if "ackkit-testkit" in p.read_text(encoding="utf-8")]


def test_the_pages_that_name_it_are_found() -> None:
    found = {str(p.relative_to(ROOT)) for p in naming_pages()}
    assert {"README.md", "docs/guide/testing.md", "testkit/README.md"} <= found


@pytest.mark.parametrize("path", naming_pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_page_naming_ackkit_testkit_gives_the_working_command(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    assert WORKS in text, f"{path}: names ackkit-testkit but not `{WORKS}`"
    assert FAILS not in text, f"{path}: shows `{FAILS}` (not on PyPI: it finds nothing)"


def test_the_kit_says_the_working_command_when_it_is_missing() -> None:
    assert _kit.INSTALL == WORKS
    assert WORKS in str(_kit.missing("a RabbitMQ node of the kit's own"))
    assert "not on PyPI" in str(_kit.missing("x"))


def test_the_working_command_installs_ackkit_testkit_from_the_checkout() -> None:
    """/path/to/ackkit is this checkout: pip (offline, a dry run) resolves the testkit/
    directory to ackkit-testkit, its pin satisfied by the ackkit already installed."""
    path = WORKS.split()[-1].replace("/path/to/ackkit", str(ROOT))
    pip = [sys.executable, "-m", "pip", "install", "--dry-run", "--no-index"]
    res = subprocess.run(
        [*pip, "--no-build-isolation", "--quiet", "--report", "-", path],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    names = [i["metadata"]["name"] for i in json.loads(res.stdout)["install"]]
    assert names == ["ackkit-testkit"]
