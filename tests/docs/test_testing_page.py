"""docs/guide/testing.md shows an AsyncApp test that plain pytest runs (no
pytest-asyncio, no anyio marker): the block is written to a file and run by pytest in
a process of its own with those plugins off; it passes (tests/docs/test_examples.py
runs it as well, in its notebook-like harness, which would also run an async test)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from ._blocks import DOCS, ROOT, Block, blocks

PAGE = DOCS / "guide" / "testing.md"


def plain_pytest_async_blocks() -> list[Block]:
    """Unmarked python blocks that test an AsyncApp in a plain `def test_...`."""
    return [
        b
        for b in blocks(PAGE)
        if b.lang == "python"
        and b.marker is None
        and "AsyncApp(" in b.code
        and "asyncio.run(" in b.code
        and "\ndef test_" in f"\n{b.code}"
        and "async def test_" not in b.code
    ]


def test_an_async_app_test_runs_under_plain_pytest(tmp_path: Path) -> None:
    found = plain_pytest_async_blocks()
    assert found, f"{PAGE.relative_to(ROOT)} shows no AsyncApp test for plain pytest"
    (tmp_path / "test_from_docs.py").write_text(found[0].code)
    plugins_off = ["-p", "no:cacheprovider", "-p", "no:asyncio", "-p", "no:anyio"]
    res = subprocess.run(
        [sys.executable, "-m", "pytest", *plugins_off, "-q", "test_from_docs.py"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert "1 passed" in res.stdout, res.stdout
