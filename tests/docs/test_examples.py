"""Every example in the documentation runs: each ```python block of README.md and
docs/**/*.md is executed, and each ```console block that shows ackkit's output is run
and compared with what the command really prints.

How a page runs (like a notebook): its blocks run in order in one namespace, on one
in-memory broker (``InMemoryBroker(ttl_scale=0)``: retry delays do not wait). The
broker URL the docs show, ``amqp://guest:guest@127.0.0.1:5672/%2f``, and the names
``url`` / ``URL`` mean that broker (``DOCS`` is the docs directory, for hidden
setups). ``app.run()`` (which would block until a signal) starts the app and stops it
again. A block that defines ``test_*`` functions has them
called, with the test kit's fixtures by name (``memory_broker``, ``amqp_broker``,
``queue_factory``, ``tmp_path``, ``monkeypatch``; ``postgres_dsn``: the kit's, one
database for the page). Console blocks run ``ackkit`` in
this process against the page's broker (``AMQP_URL``), after the page's earlier
blocks. Markers (an HTML comment before a block) are in ``_blocks.py``; blocks marked
``real-broker`` run in tests/docs/test_examples_real.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import itertools
import linecache
import re
import shlex
import sys
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from ackkit import App
from ackkit.testing import InMemoryBroker

from ._blocks import DOCS, ROOT, Block, blocks, pages

DOC_URL = "amqp://guest:guest@127.0.0.1:5672/%2f"
_ids = itertools.count()


def runnable_pages() -> list[Path]:
    return [p for p in pages() if any(b.lang in ("python", "console") for b in blocks(p))]


@contextlib.contextmanager
def run_returns() -> Iterator[None]:
    """app.run() starts the app and stops it (instead of waiting for a signal)."""
    from ackkit import AsyncApp

    def run(self: App) -> None:
        self.start()
        self.stop()

    async def arun(self: Any) -> None:
        await self.start()
        await self.stop()

    saved = App.run, AsyncApp.run
    App.run, AsyncApp.run = run, arun  # type: ignore[method-assign]
    try:
        yield
    finally:
        App.run, AsyncApp.run = saved  # type: ignore[method-assign]


class Page:
    """One page's namespace, broker and fixtures."""

    def __init__(
        self, path: Path, broker: Any, tmp_path: Path, request: pytest.FixtureRequest
    ) -> None:
        self.path = path
        self.request = request
        self.broker = broker
        self.tmp_path = tmp_path
        name = f"docs_example_{next(_ids)}"
        self.module = types.ModuleType(name)  # importable: pydantic and pickle-free lookups
        sys.modules[name] = self.module
        self.ns = self.module.__dict__
        self.ns.update(url=broker.url, URL=broker.url, broker=broker, DOCS=DOCS)
        self.ran: set[str] = set()
        self.memory: list[InMemoryBroker] = []

    def close(self) -> None:
        sys.modules.pop(self.module.__name__, None)
        for b in self.memory:
            b.close()

    def source(self, code: str) -> str:
        return code.replace(DOC_URL, self.broker.url)

    def run(self, code: str, where: str) -> None:
        src = self.source(code)
        linecache.cache[where] = (len(src), None, src.splitlines(True), where)  # tracebacks
        exec(compile(src, where, "exec"), self.ns)

    def setup(self, block: Block) -> None:
        for setup in block.setup:
            self.run(setup, f"{block.where} (setup)")

    def execute(self, block: Block) -> None:
        self.run(block.code, block.where)
        for name, fn in list(self.ns.items()):
            if name.startswith("test_") and callable(fn) and name not in self.ran:
                self.ran.add(name)
                self.call_test(fn)

    def fixture(self, name: str, memory: InMemoryBroker | None, mp: pytest.MonkeyPatch) -> Any:
        if name == "monkeypatch":
            return mp
        if name in ("memory_broker", "amqp_broker"):
            return memory
        if name == "tmp_path":
            return self.tmp_path
        if name == "postgres_dsn":  # started only for a page whose test asks for it
            return self.request.getfixturevalue("postgres_dsn")
        if name == "queue_factory":
            counter = itertools.count(1)
            return lambda tag="", **_: f"t.docs.{tag or 'q'}.{next(counter)}"
        raise LookupError(f"the docs test provides no fixture {name!r}")

    def call_test(self, fn: Callable[..., Any]) -> None:
        # the test's own @pytest.mark.ttl_scale(f), as the kit's fixtures honour it
        scale = [m.args[0] for m in getattr(fn, "pytestmark", []) if m.name == "ttl_scale"]
        memory = InMemoryBroker(ttl_scale=scale[0] if scale else 1.0)
        self.memory.append(memory)
        with pytest.MonkeyPatch.context() as mp:
            args = [self.fixture(p, memory, mp) for p in inspect.signature(fn).parameters]
            result = fn(*args)
            if inspect.iscoroutine(result):
                asyncio.run(result)

    def console(self, block: Block) -> None:
        from typer.testing import CliRunner

        from ackkit.cli import build_cli

        for argv, expected in parse_console(block.code):
            if not expected:
                continue  # the page shows no output for it: nothing to check
            if argv[0] != "ackkit":
                pytest.fail(f"{block.where}: only `ackkit` commands can be checked: {argv}")
            res = CliRunner().invoke(
                build_cli(),
                argv[1:],
                env={"AMQP_URL": self.broker.url, "COLUMNS": "80"},
                prog_name="ackkit",
            )
            got = [line.rstrip() for line in res.output.rstrip("\n").split("\n")]
            assert matches(expected, got), (
                f"{block.where}: the docs show\n"
                + "\n".join(expected)
                + f"\nfor {shlex.join(argv)}, ackkit printed\n"
                + "\n".join(got)
            )


def parse_console(text: str) -> list[tuple[list[str], list[str]]]:
    """Each command (as argv) with the output lines the page shows after it."""
    out: list[tuple[list[str], list[str]]] = []
    for line in text.rstrip("\n").split("\n"):
        if line.startswith("$ "):
            out.append((shlex.split(line[2:], comments=True), []))
        elif out:
            out[-1][1].append(line)
    return out


def shows_output(block: Block) -> bool:
    return block.lang == "console" and any(
        line and not line.startswith("$ ") for line in block.code.split("\n")
    )


def matches(expected: list[str], got: list[str]) -> bool:
    """Line by line; a line ``...`` stands for any lines, ``…`` inside a line for any text."""
    pattern = "".join(
        r"(?:.*\n)*?" if line.strip() == "..." else re.escape(line).replace("…", ".*") + r"\n"
        for line in expected
    )
    return re.fullmatch(pattern, "".join(line + "\n" for line in got)) is not None


@pytest.mark.timeout(120)
@pytest.mark.parametrize("path", runnable_pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_examples_on_the_page_run(
    path: Path, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    with InMemoryBroker(ttl_scale=0) as broker, run_returns():
        page = Page(path, broker, tmp_path, request)
        try:
            for block in blocks(path):
                if block.marker is not None:
                    continue
                page.setup(block)
                if block.lang == "python":
                    page.execute(block)
                elif shows_output(block):
                    page.console(block)
        finally:
            page.close()


def test_every_marker_says_why() -> None:
    marked = [b for p in pages() for b in blocks(p) if b.marker == "skip"]
    assert all(b.reason for b in marked), [b.where for b in marked if not b.reason]


def test_console_blocks_with_output_run_ackkit_or_are_marked() -> None:
    bad = [
        b.where
        for p in pages()
        for b in blocks(p)
        if shows_output(b)
        and b.marker is None
        and any(argv[0] != "ackkit" for argv, shown in parse_console(b.code) if shown)
    ]
    assert not bad, f"console blocks whose output cannot be checked, unmarked: {bad}"
