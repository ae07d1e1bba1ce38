"""The one public face: `ackkit.__all__`, and what importing ackkit costs."""

from __future__ import annotations

import subprocess
import sys

import ackkit


def test_all_is_sorted_and_every_name_resolves() -> None:
    assert ackkit.__all__ == sorted(ackkit.__all__)
    assert len(set(ackkit.__all__)) == len(ackkit.__all__)
    for name in ackkit.__all__:
        assert getattr(ackkit, name) is not None, name


def test_every_public_ackkit_object_in_the_package_namespace_is_in_all() -> None:
    public = {
        n
        for n, v in vars(ackkit).items()
        if not n.startswith("_") and getattr(v, "__module__", "").startswith("ackkit.")
    }
    assert public <= set(ackkit.__all__)


def test_importing_ackkit_imports_no_optional_dependency() -> None:
    """Metrics, tracing, asyncio and Spark support load only when asked for."""
    code = (
        "import sys, ackkit, ackkit.tracing; "
        "heavy = ('prometheus_client', 'opentelemetry', 'aio_pika', 'pyspark', 'typer'); "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in heavy))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "[]"
