"""Delivery and AsyncDelivery are siblings of one read-only base: the type checker sees
an AsyncDelivery's settle as a coroutine (an un-awaited `d.ack()` is an error), and the
handler binding still hands either runtime's delivery to a `Delivery`-annotated
parameter."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ackkit import App, AsyncApp, AsyncDelivery, Delivery
from ackkit._messages.delivery import DeliveryBase

pytest.importorskip("mypy")

SNIPPET = """
from ackkit import AsyncDelivery, Delivery

async def async_handler(d: AsyncDelivery) -> None:
    d.ack()
    await d.nack(requeue=False)

def sync_handler(d: Delivery) -> None:
    d.ack()
    print(d.body, d.attempt, d.headers)

async def passes_it_on(d: AsyncDelivery) -> None:
    sync_handler(d)  # its ack() would only make a coroutine: refused
"""


def test_mypy_catches_an_unawaited_settle_and_an_async_delivery_passed_as_delivery(
    tmp_path: Path,
) -> None:
    src = tmp_path / "handlers.py"
    src.write_text(textwrap.dedent(SNIPPET))
    root = Path(__file__).resolve().parents[2]
    # In a process of its own: mypy raises the interpreter's recursion limit for good.
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            str(src),
            "--strict",
            "--no-error-summary",
            # only the snippet's errors: ackkit's own modules are checked by `make check`
            "--follow-imports",
            "silent",
            "--ignore-missing-imports",
            "--cache-dir",
            str(root / ".mypy_cache"),
            "--config-file",
            os.devnull,
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=root,
    )
    out, err, status = run.stdout, run.stderr, run.returncode
    lines = [ln for ln in out.splitlines() if "error" in ln and "handlers.py" in ln]
    assert status == 1, out + err
    assert len(lines) == 2, out
    assert "handlers.py:5:" in lines[0] and "unused-coroutine" in lines[0], out
    assert "handlers.py:13:" in lines[1] and "arg-type" in lines[1], out


def test_siblings_share_the_read_only_base_and_not_the_settle_methods() -> None:
    assert issubclass(Delivery, DeliveryBase) and issubclass(AsyncDelivery, DeliveryBase)
    assert not issubclass(AsyncDelivery, Delivery)
    assert not hasattr(DeliveryBase, "ack")
    assert "tracked" not in dir(Delivery)  # plumbing is private


def test_a_delivery_annotation_binds_on_both_runtimes() -> None:
    async def a(d: Delivery) -> None: ...

    async def b(d: AsyncDelivery) -> None: ...

    def c(d: Delivery) -> None: ...

    app = AsyncApp()
    app.listener("q1")(a)
    app.listener("q2")(b)
    app.listener("q3")(c)
    assert all(s.binding.gets_delivery for s in app.specs)
    sync = App()
    sync.listener("q")(c)
    assert sync.specs[0].binding.gets_delivery
