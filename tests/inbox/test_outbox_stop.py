"""A graceful stop while the outbox relay is mid-batch (App and AsyncApp, a real
RabbitMQ and PostgreSQL): the relay finishes the batch it has sent (its rows deleted)
and takes no other; the next app sends the rest. Every event reaches its queue once.

The relay's DELETE is held in PostgreSQL (a trigger sleeps) so that the stop comes
after the broker confirmed a batch and before its rows are gone, on any machine: an
AsyncApp cancelled its relay there, the DELETE was cancelled with it, and the next
app sent the batch again with the same message ids."""

from __future__ import annotations

import uuid
from collections import Counter
from typing import Any

import psycopg
import pytest

from ackkit import App, AsyncApp, Consumer, Delivery
from ackkit.inbox import Inbox
from ackkit.testing import BrokerHandle

from ._harness import effects, effects_table, eventually, running
from .test_outbox_pg import outbox_rows

pytestmark = [pytest.mark.integration, pytest.mark.one_leg]

N = 200
HOLD = 1.5
"""Seconds each of the relay's DELETEs takes while the stop comes (the trigger)."""

STALL_DELETES = f"""
CREATE OR REPLACE FUNCTION stall_outbox_delete() RETURNS trigger LANGUAGE plpgsql AS
$$ BEGIN PERFORM pg_sleep({HOLD}); RETURN NULL; END $$;
CREATE TRIGGER stall_outbox_delete BEFORE DELETE ON ackkit_outbox
    FOR EACH STATEMENT EXECUTE FUNCTION stall_outbox_delete();
"""


def event_app(kind: str, url: str, src: str, dst: str, dsn: str, **options: Any) -> Any:
    """`src`'s handler records its message and enqueues one event to `dst`."""
    inbox = Inbox(dsn)
    consumer = Consumer(concurrency=4, prefetch=20)
    cname = f"outbox-stop-{uuid.uuid4().hex[:6]}"
    if kind == "sync":
        app: Any = App(url, connection_name=cname, **options)

        @app.listener(src, inbox=inbox, consumer=consumer, name="src")
        def on_src(body: bytes, d: Delivery) -> None:
            d.db.execute("INSERT INTO effects (msg) VALUES (%s)", (body.decode(),))
            d.publish(dst, body, message_id=f"{body.decode()}-e")

    else:
        app = AsyncApp(url, connection_name=cname, **options)

        @app.listener(src, inbox=inbox, consumer=consumer, name="src")
        async def aon_src(body: bytes, d: Delivery) -> None:
            await d.db.execute("INSERT INTO effects (msg) VALUES (%s)", (body.decode(),))
            await d.publish(dst, body, message_id=f"{body.decode()}-e")  # type: ignore[func-returns-value]

    return app


def relay_deleting(dsn: str) -> bool:
    """Is the relay's DELETE of a sent batch running (held by the trigger)?"""
    with psycopg.connect(dsn, autocommit=True) as c:
        row = c.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE state = 'active' "
            "AND query LIKE 'DELETE FROM ackkit_outbox%'"
        ).fetchone()
        return bool(row and row[0])


def received(broker: BrokerHandle, queue: str) -> Counter[str]:
    """What `queue` holds, by message id (read with a raw client, taken off the queue)."""
    got: Counter[str] = Counter()
    conn = broker.connect()
    try:
        ch = conn.channel()
        while True:
            method, props, _ = ch.basic_get(queue, auto_ack=True)
            if method is None:
                return got
            got[str(props.message_id)] += 1
    finally:
        conn.close()


def stop_mid_batch_then_restart(
    kind: str, rabbitmq: BrokerHandle, queue_factory: Any, dsn: str, **options: Any
) -> None:
    """Stop an app while its relay's DELETE of a confirmed batch is held, start another
    (the DELETE no longer held): every event reaches its queue once."""
    effects_table(dsn)
    with psycopg.connect(dsn, autocommit=True) as c:
        # a statement whose client went away ends at once (not when its sleep is over)
        c.execute(f"ALTER DATABASE {c.info.dbname} SET client_connection_check_interval = 50")
    src, dst = queue_factory("src"), queue_factory("events", declare=True)
    bodies = [f"m{i}" for i in range(N)]
    first = event_app(kind, rabbitmq.url, src, dst, dsn, **options)
    with running(kind, first):
        eventually(lambda: outbox_rows(dsn) == 0, what="the tables made by the app")
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute(STALL_DELETES)
        rabbitmq.publish_many(src, [b.encode() for b in bodies])
        # a batch confirmed by the broker: the relay now waits in its DELETE
        eventually(lambda: relay_deleting(dsn), what="the relay in its DELETE")
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("DROP TRIGGER stall_outbox_delete ON ackkit_outbox")
    second = event_app(kind, rabbitmq.url, src, dst, dsn)
    with running(kind, second):
        eventually(lambda: len(effects(dsn)) >= N, timeout=60, what="every message handled")
        rabbitmq.wait_for(src, ready=0, unacked=0, timeout=30)
        eventually(lambda: outbox_rows(dsn) == 0, timeout=30, what="the outbox drained")
    got = received(rabbitmq, dst)
    twice = sorted(m for m, n in got.items() if n > 1)
    assert not twice, f"{len(twice)} event(s) sent more than once: {twice[:10]}"
    assert sorted(got) == sorted(f"{b}-e" for b in bodies)
    assert sorted(effects(dsn)) == sorted(bodies)


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_graceful_stop_mid_batch_sends_each_event_once(
    kind: str, rabbitmq: BrokerHandle, queue_factory: Any, postgres_dsn: str
) -> None:
    """The relay ends its batch (deleted) before the app closes, and takes no other."""
    stop_mid_batch_then_restart(kind, rabbitmq, queue_factory, postgres_dsn)


def test_a_stop_out_of_time_still_deletes_the_confirmed_batch(
    rabbitmq: BrokerHandle, queue_factory: Any, postgres_dsn: str
) -> None:
    """No time left for the relay (shutdown_timeout=0): the AsyncApp cancels it, and
    its DELETE of what the broker confirmed runs to its end all the same."""
    stop_mid_batch_then_restart(
        "async", rabbitmq, queue_factory, postgres_dsn, shutdown_timeout=0.0
    )
