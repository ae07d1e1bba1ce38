"""docs/reference/cli.md has a section for every `ackkit` command, with the help the
command prints (a new command or a changed help text fails here until
`python -m tests.docs.refresh_cli` rewrites the page)."""

from __future__ import annotations

import pytest

from .refresh_cli import PAGE, page


def test_the_cli_page_is_what_the_cli_prints() -> None:
    pytest.importorskip("typer")
    assert PAGE.read_text() == page(), "run: python -m tests.docs.refresh_cli"
