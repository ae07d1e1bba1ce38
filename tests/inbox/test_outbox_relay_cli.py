"""`ackkit outbox relay`, the standalone relay, on a real PostgreSQL and RabbitMQ: rows
written with `enqueue()` outside any app reach the queue once each, in order, the
outbox ends empty, a second run sends nothing; the long-running form stops cleanly on
SIGTERM."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
from typing import Any

import psycopg
import pytest
from typer.testing import CliRunner

from ackkit.cli import build_cli
from ackkit.inbox import SCHEMA, aenqueue, enqueue
from ackkit.testing import BrokerHandle

from ._harness import eventually

pytestmark = pytest.mark.integration


def write(dsn: str, queue: str, ids: list[str], *, rolled_back: str | None = None) -> None:
    """Enqueue `ids` in one committed transaction (and `rolled_back` in one that is not)."""
    with psycopg.connect(dsn) as conn:
        with conn.transaction():
            conn.execute(SCHEMA)
        with conn.transaction():
            for m in ids:
                enqueue(conn, queue, {"id": m}, message_id=m)
        if rolled_back is not None:
            with pytest.raises(ZeroDivisionError), conn.transaction():
                enqueue(conn, queue, {"id": rolled_back}, message_id=rolled_back)
                _ = 1 / 0


def outbox_rows(dsn: str) -> int:
    with psycopg.connect(dsn) as c:
        row = c.execute("SELECT count(*) FROM ackkit_outbox").fetchone()
        return int(row[0]) if row else 0


def relay_once(url: str, dsn: str) -> Any:
    return CliRunner().invoke(
        build_cli(), ["outbox", "relay", "--once", "--url", url, "--dsn", dsn]
    )


def test_once_sends_each_row_once_in_order_then_nothing(
    rabbitmq: BrokerHandle, queue_factory: Any, postgres_dsn: str
) -> None:
    q = queue_factory("relay", declare=True)
    ids = [f"m-{i}" for i in range(250)]  # more than one batch of the relay
    write(postgres_dsn, q, ids, rolled_back="never")

    first = relay_once(rabbitmq.url, postgres_dsn)
    assert first.exit_code == 0, first.output
    assert "250 sent" in first.output
    got = rabbitmq.messages(q, take=True)
    assert [m.properties.message_id for m in got] == ids  # once each, in commit order
    assert [m.json()["id"] for m in got] == ids
    assert outbox_rows(postgres_dsn) == 0

    second = relay_once(rabbitmq.url, postgres_dsn)
    assert second.exit_code == 0, second.output
    assert "0 sent" in second.output
    assert rabbitmq.counts(q).total == 0


def test_enqueue_returns_the_message_id_the_message_is_sent_with(
    rabbitmq: BrokerHandle, queue_factory: Any, postgres_dsn: str
) -> None:
    """enqueue / aenqueue return the id the row stores and the broker delivers: the one
    given, a new one by default, and a new one for message_id=None (an outbox message
    may be sent twice; its id is how a consumer knows)."""
    q = queue_factory("ids", declare=True)

    async def enqueue_async() -> str:
        aconn = await psycopg.AsyncConnection.connect(postgres_dsn)
        async with aconn, aconn.transaction():
            return await aenqueue(aconn, q, {"n": 4}, message_id=None)

    with psycopg.connect(postgres_dsn) as conn:
        with conn.transaction():
            conn.execute(SCHEMA)
        with conn.transaction():
            given = enqueue(conn, q, {"n": 1}, message_id="given-1")
            default = enqueue(conn, q, {"n": 2})
            none = enqueue(conn, q, {"n": 3}, message_id=None)
    anone = asyncio.run(enqueue_async())
    returned = [given, default, none, anone]
    assert given == "given-1"
    assert all(re.fullmatch(r"[0-9a-f]{32}", i) for i in returned[1:]), returned
    assert len(set(returned)) == 4
    with psycopg.connect(postgres_dsn) as c:
        rows = c.execute("SELECT properties->>'message_id' FROM ackkit_outbox ORDER BY id")
        assert [r[0] for r in rows.fetchall()] == returned

    r = relay_once(rabbitmq.url, postgres_dsn)
    assert r.exit_code == 0, r.output
    got = rabbitmq.messages(q, take=True)
    assert [m.json()["n"] for m in got] == [1, 2, 3, 4]
    assert [m.properties.message_id for m in got] == returned


def test_once_with_an_unroutable_row_fails_and_keeps_it(
    rabbitmq: BrokerHandle, queue_factory: Any, postgres_dsn: str
) -> None:
    missing = queue_factory("missing")  # never declared: the broker returns the message
    write(postgres_dsn, missing, ["lost?"])
    r = relay_once(rabbitmq.url, postgres_dsn)
    assert r.exit_code == 1
    assert "error" in r.output
    assert outbox_rows(postgres_dsn) == 1  # kept for a later run


def test_runs_until_sigterm_and_exits_cleanly(
    rabbitmq: BrokerHandle, queue_factory: Any, postgres_dsn: str
) -> None:
    q = queue_factory("relay", declare=True)
    write(postgres_dsn, q, ["before-0", "before-1"])
    proc = subprocess.Popen(
        [sys.executable, "-m", "ackkit.cli", "outbox", "relay", "--poll", "0.2"],
        env={**os.environ, "AMQP_URL": rabbitmq.url, "ACKKIT_OUTBOX_DSN": postgres_dsn},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        rabbitmq.wait_for(q, ready=2, timeout=20)
        write(postgres_dsn, q, [f"after-{i}" for i in range(3)])  # picked up while running
        rabbitmq.wait_for(q, ready=5, timeout=20)
        eventually(lambda: outbox_rows(postgres_dsn) == 0, what="outbox drained")
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert "5 sent" in err
    got = [m.properties.message_id for m in rabbitmq.messages(q, take=True)]
    assert got == ["before-0", "before-1", "after-0", "after-1", "after-2"]
