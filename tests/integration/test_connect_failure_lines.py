"""App's connection failures are reported by ackkit in one line an attempt (cause
included), without pika's per-attempt ERROR lines and tracebacks, unless pika's logger
is at DEBUG: a broker that is down printed 61 lines in 5 s (now 1 an attempt), a wrong
password 12 with a pika traceback."""

from __future__ import annotations

import logging
import socket
from typing import Any

import pytest

from ackkit import App
from ackkit.testing import BrokerHandle


def closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = int(s.getsockname()[1])
    s.close()
    return port


def start_fails(url: str) -> Exception:
    app = App(url, startup_timeout=2)

    @app.listener("orders")
    def handle(order: dict[str, Any]) -> None: ...

    with pytest.raises(Exception) as info:
        app.start()
    return info.value


def test_a_broker_that_is_down_logs_one_line_an_attempt(caplog: Any) -> None:
    caplog.set_level(logging.INFO)
    exc = start_fails(f"amqp://guest:guest@127.0.0.1:{closed_port()}/%2f")
    assert "within 2.0 s" in str(exc)
    pika_lines = [r for r in caplog.records if r.name.startswith("pika")]
    ours = [r for r in caplog.records if r.name == "ackkit"]
    assert pika_lines == []
    assert ours and all("Connection refused" in r.getMessage() for r in ours)
    assert all(r.exc_info is None for r in caplog.records)  # no traceback


def test_pika_lines_come_back_at_debug(caplog: Any) -> None:
    caplog.set_level(logging.DEBUG, logger="pika")
    start_fails(f"amqp://guest:guest@127.0.0.1:{closed_port()}/%2f")
    assert any(r.name.startswith("pika") and r.levelno >= logging.ERROR for r in caplog.records)


@pytest.mark.integration
def test_a_wrong_password_fails_in_few_lines_cause_first(
    rabbitmq: BrokerHandle, caplog: Any
) -> None:
    caplog.set_level(logging.INFO)
    url = rabbitmq.url.replace("guest:guest@", "guest:wrong@")
    assert url != rabbitmq.url
    exc = start_fails(url)
    assert "ACCESS_REFUSED" in str(exc) or "credentials" in str(exc).lower(), exc
    assert "wrong" not in str(exc)  # the password is masked
    assert [r for r in caplog.records if r.name.startswith("pika")] == []
    assert all(r.exc_info is None for r in caplog.records)
    assert len(caplog.records) <= 2, [r.getMessage() for r in caplog.records]
