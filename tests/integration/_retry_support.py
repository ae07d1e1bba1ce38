"""Helpers shared by the retry / dead-letter / DLQ tool / CLI integration tests."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pika
import pika.exceptions

import ackkit

REPO = Path(__file__).resolve().parents[2]


def wait_until(pred: Callable[[], Any], timeout: float = 10.0, interval: float = 0.02) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(interval)
    return pred()


def publish(
    url: str,
    queue: str,
    body: bytes | str,
    *,
    declare: bool = False,
    arguments: dict[str, Any] | None = None,
    **props: Any,
) -> None:
    """Publish one message with confirms (declaring the queue first if asked)."""
    with ackkit.connect(url) as c:
        if declare:
            c.declare_queue(queue, arguments)
        c.publish(queue, body, **props)


@contextlib.contextmanager
def channel(url: str) -> Iterator[Any]:
    conn = pika.BlockingConnection(pika.URLParameters(url))
    try:
        yield conn.channel()
    finally:
        with contextlib.suppress(Exception):
            conn.close()


def drain(url: str, queue: str) -> list[tuple[Any, bytes]]:
    """Take every message out of `queue` (basic.get + ack): what the broker holds."""
    out: list[tuple[Any, bytes]] = []
    with channel(url) as ch:
        while True:
            method, props, body = ch.basic_get(queue, auto_ack=False)
            if method is None:
                return out
            out.append((props, body))
            ch.basic_ack(method.delivery_tag)


def peek(url: str, queue: str) -> list[tuple[Any, bytes]]:
    """Read every message of `queue` and put them all back (channel close requeues)."""
    out: list[tuple[Any, bytes]] = []
    with channel(url) as ch:
        while True:
            method, props, body = ch.basic_get(queue, auto_ack=False)
            if method is None:
                return out
            out.append((props, body))


def queue_exists(url: str, queue: str) -> bool:
    try:
        with channel(url) as ch:
            ch.queue_declare(queue, passive=True)
    except pika.exceptions.ChannelClosedByBroker as exc:
        if exc.reply_code == 404:
            return False
        raise
    return True


class Worker:
    """tests/integration/_retry_worker.py in a subprocess, with its invocation log."""

    def __init__(self, url: str, queue: str, log: Path, *args: str) -> None:
        self.url = url
        self.queue = queue
        self.log = log
        self.args = list(args)
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 30.0) -> Worker:
        before = len(self.ready_pids())
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        err = open(self.errfile, "ab")  # noqa: SIM115 - the child keeps it
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.integration._retry_worker",
                "--url",
                self.url,
                "--queue",
                self.queue,
                "--log",
                str(self.log),
                *self.args,
            ],
            cwd=REPO,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
        err.close()
        deadline = time.monotonic() + timeout
        while len(self.ready_pids()) <= before:
            if self.proc.poll() is not None:
                raise RuntimeError(f"worker exited with {self.proc.returncode}: {self.stderr()}")
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError("worker did not start consuming in time")
            time.sleep(0.02)
        return self

    @property
    def errfile(self) -> Path:
        return self.log.with_suffix(".stderr")

    def stderr(self) -> str:
        return self.errfile.read_text()[-3000:] if self.errfile.exists() else ""

    def ready_pids(self) -> list[int]:
        return [e["ready"] for e in read_log(self.log) if "ready" in e]

    def invocations(self) -> list[dict[str, Any]]:
        return [e for e in read_log(self.log) if "attempt" in e]

    def kill(self) -> None:
        """SIGKILL: no graceful shutdown, the broker requeues whatever was unacked."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        return self.proc.returncode


def read_log(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        if line.strip():
            out.append(json.loads(line))
    return out


def header_text(value: Any) -> Any:
    return value.decode() if isinstance(value, bytes) else value
