"""The outbox on a real PostgreSQL and RabbitMQ, App and AsyncApp: a handler's publish
is written in its transaction and sent after the commit (never when it rolls back),
in order; `enqueue` serves code outside listeners; the outbox table ends empty."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import psycopg
import pytest

from ackkit import App, AsyncApp, Delivery, Retry, RetryStrategy
from ackkit.inbox import Inbox, enqueue
from ackkit.testing import BrokerHandle

from ._harness import effects, effects_table, eventually, running

pytestmark = [pytest.mark.integration, pytest.mark.one_leg]

KINDS = ["sync", "async"]


def outbox_rows(dsn: str) -> int:
    """Rows in the outbox; -1 before the app made the table."""
    with psycopg.connect(dsn) as c:
        try:
            row = c.execute("SELECT count(*) FROM ackkit_outbox").fetchone()
        except psycopg.errors.UndefinedTable:
            return -1
        return int(row[0]) if row else 0


def two_listeners(kind: str, url: str, q1: str, q2: str, dsn: str, fail_first: bool) -> Any:
    """q1's handler records its message and publishes 3 follow-ups to q2 (failing once,
    after publishing, when `fail_first`); q2's handler records each follow-up."""
    inbox = Inbox(dsn)
    retry = Retry(max_attempts=3, initial_interval=0.05, strategy=RetryStrategy.IN_PROCESS)
    calls = {"n": 0}
    cname = f"outbox-{uuid.uuid4().hex[:6]}"
    if kind == "sync":
        app: Any = App(url, connection_name=cname)

        @app.listener(q1, inbox=inbox, retry=retry, name="first")
        def first(body: bytes, d: Delivery) -> None:
            d.db.execute("INSERT INTO effects (msg) VALUES (%s)", (d.message_id,))
            for i in range(3):
                d.publish(q2, {"i": i}, message_id=f"{d.message_id}-{i}")
            calls["n"] += 1
            if fail_first and calls["n"] == 1:
                raise RuntimeError("after publishing: rolled back, nothing sent")

        @app.listener(q2, inbox=inbox, name="second")
        def second(body: dict, d: Delivery) -> None:  # type: ignore[type-arg]
            d.db.execute("INSERT INTO effects (msg) VALUES (%s)", (d.message_id,))

    else:
        app = AsyncApp(url, connection_name=cname)

        @app.listener(q1, inbox=inbox, retry=retry, name="first")
        async def afirst(body: bytes, d: Delivery) -> None:
            await d.db.execute("INSERT INTO effects (msg) VALUES (%s)", (d.message_id,))
            for i in range(3):
                await d.publish(q2, {"i": i}, message_id=f"{d.message_id}-{i}")  # type: ignore[func-returns-value]
            calls["n"] += 1
            if fail_first and calls["n"] == 1:
                raise RuntimeError("after publishing: rolled back, nothing sent")

        @app.listener(q2, inbox=inbox, name="second")
        async def asecond(body: dict, d: Delivery) -> None:  # type: ignore[type-arg]
            await d.db.execute("INSERT INTO effects (msg) VALUES (%s)", (d.message_id,))

    return app


@pytest.mark.parametrize("kind", KINDS)
def test_follow_ups_are_sent_after_commit_once_and_in_order(
    kind: str, rabbitmq: BrokerHandle, queue_factory: Any, postgres_dsn: str
) -> None:
    effects_table(postgres_dsn)
    q1, q2 = queue_factory("first"), queue_factory("second")
    app = two_listeners(kind, rabbitmq.url, q1, q2, postgres_dsn, fail_first=True)
    with running(kind, app):
        for m in ("a", "b"):
            rabbitmq.publish(q1, b"x", message_id=m)
        eventually(lambda: len(effects(postgres_dsn)) == 8, what="2 + 6 effects")
        rabbitmq.wait_for(q1, ready=0, unacked=0, timeout=20)
        rabbitmq.wait_for(q2, ready=0, unacked=0, timeout=20)
        eventually(lambda: outbox_rows(postgres_dsn) == 0, what="outbox drained")
    rows = effects(postgres_dsn)
    assert sorted(rows) == sorted(["a", "b", *(f"{m}-{i}" for m in "ab" for i in range(3))])
    follow = [r for r in rows if "-" in r]
    for m in "ab":  # one destination, one writer: commit order
        assert [r for r in follow if r.startswith(m)] == [f"{m}-0", f"{m}-1", f"{m}-2"]
    assert rabbitmq.counts(f"{q1}.dlq").total == 0


@pytest.mark.parametrize("kind", KINDS)
def test_enqueue_outside_listeners_commits_with_your_rows(
    kind: str, rabbitmq: BrokerHandle, queue_factory: Any, postgres_dsn: str
) -> None:
    """A web request's transaction: its rows and its messages, or neither."""
    effects_table(postgres_dsn)
    q1, q2 = queue_factory("first"), queue_factory("second")
    app = two_listeners(kind, rabbitmq.url, q1, q2, postgres_dsn, fail_first=False)
    with running(kind, app):
        eventually(lambda: outbox_rows(postgres_dsn) == 0)  # tables made by the app
        with psycopg.connect(postgres_dsn) as conn:
            with conn.transaction():
                conn.execute("INSERT INTO effects (msg) VALUES ('web')")
                enqueue(conn, q2, {"web": 1}, message_id="web-1")
            with pytest.raises(ZeroDivisionError), conn.transaction():
                enqueue(conn, q2, {"web": 2}, message_id="web-2")
                _ = 1 / 0  # rolled back: never sent
        eventually(lambda: "web-1" in effects(postgres_dsn), what="web-1 relayed")
        rabbitmq.wait_for(q2, ready=0, unacked=0, timeout=20)
        asyncio.run(asyncio.sleep(1.5))  # a relay round later: still no web-2
    assert sorted(effects(postgres_dsn)) == ["web", "web-1"]
    assert outbox_rows(postgres_dsn) == 0
