"""`ackkit console` starting against a broker slow to answer: it says what it waits for,
prints its address only once it answers there, and never calls a connection that was
made one that could not be."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
from typing import Any

import pika
import pytest
from _console_support import free_port, slow_broker
from _retry_support import REPO, wait_until

from ackkit.console import Holder, Store

pytestmark = pytest.mark.integration
DELAY = 7.0
"""Seconds the proxy holds the console's connection: more than one progress interval."""


def empty_dlq(rabbitmq: Any, name: str) -> str:
    conn = pika.BlockingConnection(pika.URLParameters(rabbitmq.url))
    conn.channel().queue_declare(name, durable=True)
    conn.close()
    return name


def answers(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True


def test_the_address_is_printed_when_it_serves_and_the_wait_is_explained(
    rabbitmq: Any, fresh_queue: str
) -> None:
    dlq, port = empty_dlq(rabbitmq, f"{fresh_queue}.dlq"), free_port()
    password = urllib.parse.urlsplit(rabbitmq.url).password or "guest"
    with slow_broker(rabbitmq.url, DELAY) as url:
        cmd = [sys.executable, "-m", "ackkit.cli", "console", "--url", url]
        cmd += ["--dlq", dlq, "--port", str(port)]
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        proc = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True)
        seen: list[tuple[float, str, bool]] = []  # (when, line, did the port answer then)
        began = time.monotonic()

        def read() -> None:
            assert proc.stderr is not None
            for line in proc.stderr:
                seen.append((time.monotonic() - began, line.rstrip("\n"), answers(port)))

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        try:
            assert wait_until(lambda: any("console on" in s for _, s, _ in seen), 60), seen
        finally:
            proc.send_signal(signal.SIGINT)
            proc.wait(60)
            reader.join(10)
            if proc.stderr is not None:
                proc.stderr.close()
    assert proc.returncode == 0, seen
    lines = [s for _, s, _ in seen]
    (on,) = [i for i, s in enumerate(lines) if "console on" in s]
    assert lines[on].startswith(f"ackkit: console on http://127.0.0.1:{port}/ (amqp://")
    assert seen[on][2], "the address was printed before the console answered there"
    assert seen[on][0] >= DELAY - 0.5
    waiting = [i for i, s in enumerate(lines) if s.endswith("(waiting for the broker)")]
    assert len(waiting) >= 2 and max(waiting) < on, lines  # at once, then every 5 s
    assert "connecting to amqp://" in lines[waiting[0]] and ":***@127.0.0.1:" in lines[0]
    text = "\n".join(lines)
    assert "could not connect" not in text and f":{password}@" not in text


def test_a_start_that_times_out_after_connecting_says_it_connected(
    rabbitmq: Any, fresh_queue: str
) -> None:
    """The broker answered the connection but not yet basic.consume (as when it is still
    requeueing a restarted console's 100,000 dead letters)."""
    dlq = empty_dlq(rabbitmq, f"{fresh_queue}.dlq")

    class SlowToConsume(Holder):
        def _open(self, q: str, k: int, gen: int) -> Any:
            time.sleep(3)
            return super()._open(q, k, gen)

    holder = SlowToConsume(rabbitmq.url, [dlq], Store([dlq]))
    said: list[str] = []
    with pytest.raises(TimeoutError) as exc:
        holder.start(timeout=1.5, progress=said.append, every=0.5)
    text = str(exc.value)
    assert "could not connect" not in text
    assert text.startswith("the console was not ready within 1.5 s: connected to amqp://")
    assert f"start delivering {dlq}" in text and ":***@" in text
    assert said and all(s.startswith("connected to") for s in said[1:])
