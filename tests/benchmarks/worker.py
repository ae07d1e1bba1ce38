"""Worker process: runs ONE case call in a fresh interpreter and measures it.

Protocol with the harness (``harness.run_one``):

1. The harness starts ``python -m <package>.worker --module M --case ID ...``.
2. The worker imports the case module and the case's ``requires``, calls its
   ``available`` hook, then prints one handshake line on stdout:
   ``@@bench ready`` or ``@@bench n/a <reason>`` (and exits) or ``@@bench error <reason>``.
3. The harness pre-fills the queue, then writes ``go`` (or ``quit``) on stdin.
4. The worker times the call (wall clock + getrusage of this process and its reaped
   children) and writes a JSON result to ``--result``.

From the handshake on, stdout is redirected to stderr (a log file), so nothing a case
prints can block on a full pipe.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import resource
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from .cases import CaseUnavailable, load_one

HANDSHAKE = "@@bench"


def _say(*words: str) -> None:
    print(HANDSHAKE, *words, flush=True)


def _cpu(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def _switches() -> int:
    """Voluntary context switches of this process so far (a thread waiting for another)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_nvcsw


def _write(path: Path, result: dict[str, Any]) -> None:
    path.write_text(json.dumps(result))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="benchmark-worker")
    parser.add_argument("--module", required=True)
    parser.add_argument("--case", required=True)
    parser.add_argument("--url", required=True)
    parser.add_argument("--queue", required=True)
    parser.add_argument("--messages", type=int, required=True)
    parser.add_argument("--result", type=Path, required=True)
    args = parser.parse_args(argv)

    try:
        bench_case = load_one(args.module, args.case)
        for module in bench_case.requires:
            try:
                importlib.import_module(module)
            except ImportError as exc:
                raise CaseUnavailable(f"cannot import {module}: {exc}") from exc
        if bench_case.available is not None:
            os.environ["ACKKIT_BENCH_URL"] = args.url  # for hooks that warm up against it
            bench_case.available()
    except CaseUnavailable as exc:
        _say("n/a", str(exc).replace("\n", " "))
        return 0
    except Exception as exc:
        traceback.print_exc()
        _say("error", f"{type(exc).__name__}: {exc}".replace("\n", " "))
        return 1

    _say("ready")
    command = sys.stdin.readline().strip()
    os.dup2(2, 1)  # from now on, case output goes to the log, never to the pipe
    if command != "go":
        return 0

    result: dict[str, Any] = {"status": "ok"}
    cpu0, child0 = _cpu(resource.RUSAGE_SELF), _cpu(resource.RUSAGE_CHILDREN)
    switches0 = _switches()
    t0 = time.perf_counter()
    measured: Any = None
    try:
        measured = bench_case.func(args.url, args.queue, args.messages)
    except CaseUnavailable as exc:
        result = {"status": "n/a", "reason": str(exc)}
    except BaseException as exc:
        traceback.print_exc()
        result = {"status": "error", "reason": f"{type(exc).__name__}: {exc}"}
    wall = time.perf_counter() - t0
    cpu = _cpu(resource.RUSAGE_SELF) - cpu0
    child = _cpu(resource.RUSAGE_CHILDREN) - child0
    result.update(
        wall_s=wall, cpu_s=cpu + child, cpu_children_s=child, switches=_switches() - switches0
    )
    if isinstance(measured, dict) and result["status"] == "ok":
        # The case timed its own window (e.g. a steady state after start-up).
        result.update(measured_s=measured["seconds"], measured_messages=measured["messages"])
    _write(args.result, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
