"""A stop requested while the pika engine waits to reconnect ends the wait at once (an
unreachable broker no longer holds `start()` past its startup_timeout by a backoff)."""

from __future__ import annotations

import threading
import time

import pytest
from tenacity import wait_fixed

from ackkit._connection import io as io_mod
from ackkit._connection.io import ConnectFailed
from ackkit._sync.engine import Engine


class Refused(Engine):
    def __init__(self) -> None:
        super().__init__("amqp://x", "amqp://x", 30.0)
        self.attempts = 0
        self.tried = threading.Event()
        self.done = threading.Event()

    def _serve(self) -> None:
        self.attempts += 1
        self.tried.set()
        raise ConnectFailed("refused")

    def finished(self) -> None:
        self.done.set()


def test_a_stop_cuts_the_reconnect_backoff_short(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(io_mod, "reconnect_wait", lambda _max: wait_fixed(30))
    e = Refused()
    e.start_io("test-io")
    assert e.tried.wait(10)
    time.sleep(0.2)  # in the 30 s backoff now
    t0 = time.monotonic()
    e.request_stop()
    assert e.done.wait(10)
    assert time.monotonic() - t0 < 5
    assert e.attempts == 1 and e.fatal is None
