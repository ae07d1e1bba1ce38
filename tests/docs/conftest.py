"""The built site, once per session (mkdocs build --strict into a temporary directory)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ._blocks import ROOT


def build_site(out: Path, root: Path = ROOT) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture(scope="session")
def built_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("mkdocs", reason="pip install 'ackkit[docs]'")
    pytest.importorskip("material", reason="pip install 'ackkit[docs]'")
    out = tmp_path_factory.mktemp("site")
    res = build_site(out)
    assert res.returncode == 0, res.stdout + res.stderr
    return out
