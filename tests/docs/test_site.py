"""The site builds with --strict: a broken link, a missing anchor, a page left out of
the nav or an API name mkdocstrings cannot find fails the build."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from .conftest import build_site


def test_the_site_builds_strictly(built_site: Path) -> None:
    for page in ("index.html", "guide/failures.html", "reference/api.html"):
        assert (built_site / page).is_file(), page
    api = (built_site / "reference/api.html").read_text()
    # the reference is generated from the code: a docstring shows up in it
    assert "A RabbitMQ stand-in in this process" in api


def test_a_broken_link_fails_the_strict_build(tmp_path: Path) -> None:
    """On a copy of the docs (the worktree is left alone)."""
    pytest.importorskip("mkdocs")
    from ._blocks import ROOT

    root = tmp_path / "repo"
    shutil.copytree(ROOT / "docs", root / "docs")
    for config in ("mkdocs.yml", "mkdocs_hooks.py"):
        shutil.copy(ROOT / config, root / config)
    for linked in ("ackkit", "tests"):
        (root / linked).symlink_to(ROOT / linked)
    page = root / "docs" / "guide" / "handlers.md"
    page.write_text(page.read_text() + "\n[gone](failures.md#no-such-anchor)\n")
    res = build_site(tmp_path / "site", root)
    assert res.returncode != 0
    assert "no-such-anchor" in res.stdout + res.stderr
