"""What `ackkit run` does besides parsing options: load the app, set it up, run it (in
one process or several), and the default logging of the command."""

from __future__ import annotations

import asyncio
import dataclasses
import importlib
import inspect
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

LOG_FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"
"""The command's default log line: time, level, logger, message."""
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def configure_logging(level: str) -> None:
    """Log lines with time and level to stderr, unless the app configured logging itself
    (the root logger has handlers already): then only the level is set."""
    root = logging.getLogger()
    if not root.handlers:
        logging.basicConfig(level=level, format=LOG_FORMAT, stream=sys.stderr)
    root.setLevel(level)
    if level != "DEBUG":  # pika's and aiormq's connection chatter: ackkit says what matters
        for name in ("pika", "aiormq", "aio_pika"):
            logging.getLogger(name).setLevel(max(logging.WARNING, logging.getLevelName(level)))


def set_startup_timeout(app: Any, seconds: float) -> None:
    """`ackkit run --startup-timeout`: on an app whose options are a frozen `settings`
    value, a copy with the new timeout; else the attribute."""
    settings = getattr(app, "settings", None)
    if settings is not None and dataclasses.is_dataclass(settings):
        app.settings = dataclasses.replace(settings, startup_timeout=seconds)  # type: ignore[type-var]
    else:
        app.startup_timeout = seconds


def load_app(target: str) -> Any:
    """`module:attr` (attr defaults to `app`) -> the App object; the cwd is importable."""
    mod_name, _, attr = target.partition(":")
    if not mod_name:
        raise ValueError(f"expected module:app, got {target!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    module = importlib.import_module(mod_name)
    obj: Any = module
    for part in (attr or "app").split("."):
        obj = getattr(obj, part)
    if callable(obj) and not hasattr(obj, "run"):
        obj = obj()  # an app factory
    if not hasattr(obj, "run"):
        raise TypeError(f"{target} is not an ackkit App (it has no run())")
    return obj


def run_app(app: Any) -> None:
    """Run an App (blocking, with its own signal handling) or an AsyncApp (asyncio.run)."""
    if inspect.iscoroutinefunction(app.run):
        asyncio.run(app.run())
    else:
        app.run()


STOPPED_COUNTS = (
    ("received", "received"),
    ("acked", "acked"),
    ("retrying", "retried"),
    ("dead_lettered", "dead-lettered"),
    ("requeued", "requeued"),
    ("returned", "returned"),
)


def stopped_line(target: str, stats: dict[str, dict[str, int]]) -> str:
    """The last line of `ackkit run`: what the app's listeners did, summed."""
    total = {key: sum(s.get(key, 0) for s in stats.values()) for key, _ in STOPPED_COUNTS}
    counts = ", ".join(f"{total[key]} {word}" for key, word in STOPPED_COUNTS)
    return f"ackkit: stopped {target}: {counts}"


def run_workers(
    target: str,
    workers: int,
    url: str | Sequence[str] | None,
    metrics_port: int | None = None,
    metrics_addr: str = "127.0.0.1",
    options: Sequence[str] = (),
) -> int:
    """Run `target` in `workers` processes; SIGINT/SIGTERM stop them all gracefully.

    With `metrics_port`, worker i serves its metrics on `metrics_port + i`; `options`
    are passed on to each worker's `ackkit run`; `url`: one or several node addresses,
    each passed on as a --url of its own."""
    cmd = [sys.executable, "-m", "ackkit.cli", "run", target, "--workers", "1", *options]
    for u in [url] if isinstance(url, str) else url or ():
        cmd += ["--url", u]

    def worker_cmd(i: int) -> list[str]:
        if metrics_port is None:
            return cmd
        return [*cmd, "--metrics-port", str(metrics_port + i), "--metrics-addr", metrics_addr]

    procs = [subprocess.Popen(worker_cmd(i), start_new_session=True) for i in range(workers)]
    stopping = False

    def stop(signum: int, _frame: Any) -> None:
        nonlocal stopping
        stopping = True
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)

    old = [signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)]
    code = 0
    try:
        while any(p.poll() is None for p in procs):
            for p in procs:
                rc = p.poll()
                if rc not in (None, 0) and not stopping:
                    print(
                        f"ackkit: worker {p.pid} exited with {rc}; stopping the others",
                        file=sys.stderr,
                    )
                    code = rc or 1
                    stop(signal.SIGTERM, None)
            time.sleep(0.1)
    finally:
        for s, h in zip((signal.SIGINT, signal.SIGTERM), old, strict=True):
            signal.signal(s, h)
        for p in procs:
            try:
                p.wait(60)
            except subprocess.TimeoutExpired:
                p.kill()
    if not code:
        code = max((p.returncode or 0 for p in procs), default=0)
    return code
