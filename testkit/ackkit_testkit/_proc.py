"""Processes of the kit's own nodes: scan, kill, and the tail of their logs."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Iterator

__all__ = ["iter_processes", "kill_pid", "tail"]


def kill_pid(pid: int, sig: int = signal.SIGKILL) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


def iter_processes() -> Iterator[tuple[int, str]]:
    """Yield ``(pid, command line)`` for every process visible to us."""
    if os.path.isdir("/proc"):
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as fh:
                    raw = fh.read()
            except OSError:
                continue
            if raw:
                yield int(entry), raw.replace(b"\0", b" ").decode("utf-8", "replace").strip()
        return
    try:
        out = subprocess.run(
            ["ps", "-axo", "pid=,args="],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return
    for line in out.splitlines():
        pid, _, args = line.strip().partition(" ")
        if pid.isdigit():
            yield int(pid), args.strip()


def tail(path: str, lines: int = 40) -> str:
    """Last ``lines`` lines of a text file ('' when it cannot be read)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - 64 * 1024))
            data = fh.read().decode("utf-8", "replace")
    except OSError:
        return ""
    return "\n".join(data.splitlines()[-lines:])
