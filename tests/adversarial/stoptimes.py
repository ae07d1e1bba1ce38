"""A pytest plugin that prints how long every App.stop() / AsyncApp.stop() took.

Used for the figures of tests/adversarial/RESULTS.md (issue 20): load it with
`-p tests.adversarial.stoptimes -s`. Each stop prints one line,
`STOPTIME <test id> <App|AsyncApp> <seconds>`; with FAULTS_STOPLOG set, the same
record is appended to that file as a JSON line. It measures, it asserts nothing.
"""

from __future__ import annotations

import functools
import json
import os
import time
from typing import Any

import pytest

from ackkit import App, AsyncApp

_current = {"test": "?"}


def _record(kind: str, took: float) -> None:
    print(f"STOPTIME {_current['test']} {kind} {took:.2f}")
    path = os.environ.get("FAULTS_STOPLOG")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"test": _current["test"], "kind": kind, "s": round(took, 3)}))
            f.write("\n")


def _wrap_sync(stop: Any) -> Any:
    @functools.wraps(stop)
    def timed(self: App, *a: Any, **kw: Any) -> None:
        t = time.monotonic()
        running = self._runtime is not None  # a stop of a running app, not a no-op
        try:
            stop(self, *a, **kw)
        finally:
            if running:
                _record("App", time.monotonic() - t)

    return timed


def _wrap_async(stop: Any) -> Any:
    @functools.wraps(stop)
    async def timed(self: AsyncApp, *a: Any, **kw: Any) -> None:
        t = time.monotonic()
        running = self._runtime is not None
        try:
            await stop(self, *a, **kw)
        finally:
            if running:
                _record("AsyncApp", time.monotonic() - t)

    return timed


def pytest_configure(config: pytest.Config) -> None:
    App.stop = _wrap_sync(App.stop)  # type: ignore[method-assign]
    AsyncApp.stop = _wrap_async(AsyncApp.stop)  # type: ignore[method-assign]


def pytest_runtest_setup(item: pytest.Item) -> None:
    _current["test"] = item.nodeid.split("::", 1)[-1]
