"""A row whose exchange does not exist does not stall the outbox relay, App, AsyncApp
and `ackkit outbox relay`, on a real PostgreSQL and RabbitMQ: it stays in the outbox (an ERROR names
the exchange) while the rows behind it to other destinations are sent; once the
exchange exists its rows follow, in their order. (Before: every round stopped at that
row, and nothing behind it was ever sent.)"""

from __future__ import annotations

import contextlib
import logging
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from ackkit import App, AsyncApp
from ackkit.inbox import Inbox, enqueue
from ackkit.inbox._relay import run_relay
from ackkit.testing import BrokerHandle

from ._harness import eventually, running

pytestmark = [pytest.mark.integration, pytest.mark.one_leg]


def outbox_ids(dsn: str) -> list[str]:
    with psycopg.connect(dsn) as c:
        try:
            rows = c.execute("SELECT properties FROM ackkit_outbox ORDER BY id").fetchall()
        except psycopg.errors.UndefinedTable:
            return ["(no table yet)"]
    return [r[0]["message_id"] for r in rows]


def topology(rabbitmq: BrokerHandle, op: Callable[[Any], object]) -> None:
    conn = rabbitmq.connect()
    try:
        op(conn.channel())
    finally:
        conn.close()


@contextlib.contextmanager
def relaying(url: str, dsn: str) -> Iterator[None]:
    """`ackkit outbox relay` (its loop, `run_relay`) on a thread, until the block ends."""
    stop = threading.Event()
    t = threading.Thread(target=run_relay, args=(url, Inbox(dsn)), kwargs={"stop": stop})
    t.start()
    try:
        yield
    finally:
        stop.set()
        t.join(30)
        assert not t.is_alive()


@pytest.mark.parametrize("kind", ["sync", "async", "relay"])
def test_a_row_to_a_missing_exchange_waits_and_the_rows_behind_it_go_on(
    kind: str,
    rabbitmq: BrokerHandle,
    queue_factory: Any,
    postgres_dsn: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    work = queue_factory("work")
    dest = queue_factory("dest", declare=True)
    later = queue_factory("later", declare=True)
    missing = f"t.ex.missing.{uuid.uuid4().hex[:8]}"
    app: Any = App(rabbitmq.url) if kind == "sync" else AsyncApp(rabbitmq.url)
    if kind == "relay":
        app = None
    elif kind == "sync":

        @app.listener(work, inbox=Inbox(postgres_dsn))
        def handle(body: bytes) -> None: ...
    else:

        @app.listener(work, inbox=Inbox(postgres_dsn))
        async def ahandle(body: bytes) -> None: ...

    caplog.set_level(logging.ERROR, logger="ackkit.inbox")
    try:
        with relaying(rabbitmq.url, postgres_dsn) if app is None else running(kind, app):
            eventually(lambda: outbox_ids(postgres_dsn) == [], what="the outbox table")
            with psycopg.connect(postgres_dsn) as conn, conn.transaction():
                enqueue(conn, "k", {"n": 1}, exchange=missing, message_id="m1")
                enqueue(conn, dest, {"n": 2}, message_id="m2")
                enqueue(conn, "k", {"n": 3}, exchange=missing, message_id="m3")
                enqueue(conn, dest, {"n": 4}, message_id="m4")
            # What the broker shows: the rows behind the missing exchange's arrived.
            eventually(lambda: rabbitmq.counts(dest).ready == 2, 30, "m2 and m4 sent")
            assert outbox_ids(postgres_dsn) == ["m1", "m3"]
            errors = [r for r in caplog.records if r.levelno == logging.ERROR]
            assert errors and all(missing in r.getMessage() for r in errors)
            assert "does not exist" in errors[0].getMessage()

            topology(rabbitmq, lambda ch: ch.exchange_declare(missing, "direct"))
            topology(rabbitmq, lambda ch: ch.queue_bind(later, missing, "k"))
            eventually(lambda: rabbitmq.counts(later).ready == 2, 90, "m1 and m3 sent")
            eventually(lambda: outbox_ids(postgres_dsn) == [], what="the outbox empty")
    finally:
        with contextlib.suppress(Exception):
            topology(rabbitmq, lambda ch: ch.exchange_delete(missing))
    got = rabbitmq.messages(later, take=True)
    assert [m.properties.message_id for m in got] == ["m1", "m3"]  # in their order
    assert [m.properties.message_id for m in rabbitmq.messages(dest, take=True)] == ["m2", "m4"]
