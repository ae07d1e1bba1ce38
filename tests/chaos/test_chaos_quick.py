"""The chaos run in its quick mode, inside `make test` (about two minutes)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .run import Settings, run, table

pytestmark = [pytest.mark.chaos, pytest.mark.integration, pytest.mark.timeout(600)]


def test_chaos_quick(tmp_path: Path) -> None:
    result = run(Settings.quick(), tmp_path / "chaos", quiet=True)
    if result.skipped:
        pytest.skip(result.skipped)
    print(table(result))
    (tmp_path / "chaos.json").write_text(json.dumps(result.figures, indent=2))
    f = result.figures
    assert result.passed, table(result)
    assert f["kills"] >= 1 and f["broker_restarts"] >= 1 and f["cuts"] >= 1
    assert (
        f["handled_ok"] + f["good_dead_lettered"]
        >= f["messages"] - f["poison"] - f["bad"] - f["slow"]
    )
