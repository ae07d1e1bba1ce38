"""Operating an app: what the log says about failures and about a start that cannot
connect, and the CLI's listings at 80 columns and piped, on a real broker."""

from __future__ import annotations

import logging
import urllib.parse
from typing import Any

import pytest
from _retry_support import publish, wait_until
from rich.cells import cell_len
from typer.testing import CliRunner

from ackkit import App, Consumer, Retry
from ackkit._connection.io import FatalConnectError
from ackkit.cli import build_cli

pytestmark = pytest.mark.integration


class Flaky(Exception):
    """Raised once, then the handler succeeds."""


def test_a_failure_that_succeeds_on_retry_leaves_its_traceback_in_the_log(
    rabbitmq: Any, fresh_queue: str, caplog: pytest.LogCaptureFixture
) -> None:
    app = App(rabbitmq.url)
    calls: list[int] = []

    @app.listener(fresh_queue, retry=Retry(max_attempts=3, initial_interval=0.05))
    def handle(body: bytes) -> None:
        calls.append(1)
        if len(calls) == 1:
            raise_flaky_in_a_named_function()

    with caplog.at_level(logging.WARNING, logger="ackkit"), app.running():
        publish(rabbitmq.url, fresh_queue, b"x", declare=True)
        assert wait_until(lambda: len(calls) == 2, 30)
        assert wait_until(lambda: rabbitmq.counts(fresh_queue).total == 0, 30)
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "Traceback (most recent call last)" in text
    assert "raise_flaky_in_a_named_function" in text and "Flaky: first try" in text
    assert rabbitmq.counts(f"{fresh_queue}.dlq").total == 0  # it succeeded


def raise_flaky_in_a_named_function() -> None:
    raise Flaky("first try")


def test_a_wrong_password_fails_at_once_without_handler_warnings(
    rabbitmq: Any, fresh_queue: str, caplog: pytest.LogCaptureFixture
) -> None:
    p = urllib.parse.urlsplit(rabbitmq.url)
    bad = urllib.parse.urlunsplit(p._replace(netloc=f"nobody:wrong@{p.hostname}:{p.port}"))
    app = App(bad)

    @app.listener(fresh_queue, consumer=Consumer(concurrency=4))
    def handle(body: bytes) -> None: ...

    with caplog.at_level(logging.INFO), pytest.raises(FatalConnectError, match="authentication"):
        app.start()
    assert not [r for r in caplog.records if "still running" in r.getMessage()]
    assert "wrong" not in caplog.text


def test_dlq_inspect_reads_at_80_columns_and_is_tsv_when_piped(
    rabbitmq: Any, fresh_queue: str
) -> None:
    dlq = f"{fresh_queue}.dlq"
    long_reason = (
        "attempts exhausted (5 of 5): " + "ValueError: the order total does not add up " * 3
    )
    for i in range(3):
        publish(
            rabbitmq.url,
            dlq,
            b"{}",
            declare=True,
            message_id=f"{i}-" + "0123456789abcdef" * 2,
            headers={
                "ackkit-reason": long_reason,
                "ackkit-error-type": "ackkit.BadPayload",
                "ackkit-attempts": 5,
                "ackkit-original-queue": fresh_queue + ".with.a.long.name",
                "ackkit-dead-lettered-at": "2026-01-01T00:00:00.000+00:00",
            },
        )
    env = {"AMQP_URL": rabbitmq.url, "COLUMNS": "80"}
    r = CliRunner().invoke(build_cli(), ["dlq", "inspect", dlq, "--format", "table"], env=env)
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert all(cell_len(ln) <= 80 for ln in lines[1:]), lines  # the title may be longer
    rows = [ln for ln in lines if ln.startswith(tuple("012"))]
    assert len(rows) == 3 and all("ackkit.B" in ln for ln in rows)  # one line per letter
    r = CliRunner().invoke(build_cli(), ["dlq", "inspect", dlq], env=env)  # piped: TSV
    assert r.exit_code == 0, r.output
    head, *body = r.output.splitlines()
    assert head.split("\t")[:4] == ["message_id", "attempts", "error_type", "reason"]
    assert len(body) == 3
    for ln in body:
        f = ln.split("\t")
        assert len(f) == 8 and f[2] == "ackkit.BadPayload" and f[3] == long_reason
    assert rabbitmq.counts(dlq).total == 3  # inspect removes nothing
