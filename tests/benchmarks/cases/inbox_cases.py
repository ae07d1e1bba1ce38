"""Inbox cases: exactly-once database effects against the hand-written at-least-once
consumer a user would write (raw pika + psycopg: insert, commit, ack per message).

Each case consumes ``n`` messages (with message_ids) and inserts one row per message
into a table of its own in PostgreSQL (``ACKKIT_BENCH_POSTGRES_DSN``, default the
machine's server at 127.0.0.1:5432). Ratios of interest: ``ackkit.inbox/pika.psycopg``
(goal >= 0.9: dedup costs at most 10%), ``ackkit.inbox_outbox/ackkit.inbox``,
``ackkit.inbox.batch/ackkit.inbox`` (one transaction per batch of 100; goal >= 5).
"""

from __future__ import annotations

import os
import time
import uuid
from typing import Any

from ackkit import Delivery, Queue  # module level: handler annotations are resolved at registration

from .. import broker as _broker
from . import CaseUnavailable, Watchdog, case
from .ackkit_cases import _run_app_until

DSN = os.environ.get("ACKKIT_BENCH_POSTGRES_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")


def _table(queue: str) -> str:
    return "bench_" + uuid.uuid5(uuid.NAMESPACE_URL, queue).hex[:16]


def _setup(url: str, queue: str, n: int) -> None:
    """The queue, filled with n persistent messages that carry message_ids; the table."""
    import pika
    import psycopg

    _broker.declare_queue(url, queue)
    conn = pika.BlockingConnection(pika.URLParameters(url))
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        body = b"x" * 200
        for i in range(n):
            props = pika.BasicProperties(delivery_mode=2, message_id=f"{queue}-{i}")
            ch.basic_publish("", queue, body, props)
    finally:
        conn.close()
    with psycopg.connect(DSN, autocommit=True) as c:
        c.execute(f"CREATE TABLE IF NOT EXISTS {_table(queue)} (msg text)")


def _cleanup(url: str, queue: str, n: int) -> None:
    import psycopg

    _broker.delete_queue(url, queue)
    _broker.delete_queue(url, queue + ".follow")
    with psycopg.connect(DSN, autocommit=True) as c:
        c.execute(f"DROP TABLE IF EXISTS {_table(queue)}")
        c.execute(f"DROP TABLE IF EXISTS {_table(queue)}_inbox")
        c.execute(f"DROP TABLE IF EXISTS {_table(queue)}_outbox")


def _available() -> None:
    try:
        import psycopg

        with psycopg.connect(DSN, connect_timeout=3) as c:
            c.execute("SELECT 1")
    except Exception as exc:
        raise CaseUnavailable(f"no PostgreSQL at ACKKIT_BENCH_POSTGRES_DSN: {exc}") from None


HOOKS: dict[str, Any] = {
    "setup": _setup,
    "cleanup": _cleanup,
    "available": _available,
    "requires": ("ackkit", "pika", "psycopg"),
}


@case("pika.psycopg", **HOOKS)
def pika_psycopg(url: str, queue: str, n: int) -> None:
    """Hand-written at-least-once: per message insert, commit, then basic.ack."""
    import pika
    import psycopg

    table = _table(queue)
    db = psycopg.connect(DSN)
    conn = pika.BlockingConnection(pika.URLParameters(url))
    count = 0
    watchdog = Watchdog(n)
    try:
        ch = conn.channel()
        ch.basic_qos(prefetch_count=100)

        def on_message(channel: Any, method: Any, props: Any, body: bytes) -> None:
            nonlocal count
            db.execute(f"INSERT INTO {table} (msg) VALUES (%s)", (props.message_id,))
            db.commit()
            channel.basic_ack(method.delivery_tag)
            count += 1
            if count >= n:
                channel.stop_consuming()

        ch.basic_consume(queue, on_message)
        while count < n:
            conn.process_data_events(time_limit=0.5)
            if watchdog.stalled(count):
                raise watchdog.error(count)
    finally:
        conn.close()
        db.close()


@case("ackkit.inbox", **HOOKS)
def ackkit_inbox(url: str, queue: str, n: int) -> None:
    """App with inbox=: the row and the key in one transaction, commit, then the ack."""
    from ackkit import App
    from ackkit.inbox import Inbox

    table = _table(queue)
    inbox = Inbox(DSN, table=f"{table}_inbox", outbox_table=f"{table}_outbox", retention=None)
    app = App(url, connection_name="bench-inbox")

    @app.listener(Queue(queue, declare=False), inbox=inbox, name="bench")
    def handle(body: bytes, d: Delivery) -> None:
        d.db.execute(f"INSERT INTO {table} (msg) VALUES (%s)", (d.message_id,))

    _run_app_until(app, n, lambda s: s.get("acked", 0))


@case("ackkit.inbox_outbox", **HOOKS)
def ackkit_inbox_outbox(url: str, queue: str, n: int) -> None:
    """The inbox case plus one follow-up message per message through the outbox (timed
    until every follow-up was relayed)."""
    import psycopg

    from ackkit import App
    from ackkit.inbox import Inbox

    table = _table(queue)
    follow = queue + ".follow"
    _broker.declare_queue(url, follow)
    inbox = Inbox(DSN, table=f"{table}_inbox", outbox_table=f"{table}_outbox", retention=None)
    app = App(url, connection_name="bench-inbox-outbox")

    @app.listener(Queue(queue, declare=False), inbox=inbox, name="bench")
    def handle(body: bytes, d: Delivery) -> None:
        d.db.execute(f"INSERT INTO {table} (msg) VALUES (%s)", (d.message_id,))
        d.publish(follow, body)

    watchdog = Watchdog(n)
    app.start()
    try:
        with psycopg.connect(DSN, autocommit=True) as c:
            while True:
                acked = app.stats()["bench"].get("acked", 0)
                try:
                    row = c.execute(f"SELECT count(*) FROM {table}_outbox").fetchone()
                    left = row[0] if row else 0
                except psycopg.errors.UndefinedTable:  # the app has not made it yet
                    left = n
                if acked >= n and left == 0:
                    return
                if watchdog.stalled(acked + (n - left)):
                    raise watchdog.error(acked)
                time.sleep(0.01)
    finally:
        app.stop()


@case("ackkit.inbox.batch", **HOOKS)
def ackkit_inbox_batch(url: str, queue: str, n: int) -> None:
    """ackkit inbox, batch listener (one transaction per batch): Batch(100, 0.05), the
    rows and the keys of a batch in one transaction, one commit, then the acks."""
    from ackkit import App, Batch
    from ackkit.inbox import Inbox

    table = _table(queue)
    inbox = Inbox(DSN, table=f"{table}_inbox", outbox_table=f"{table}_outbox", retention=None)
    app = App(url, connection_name="bench-inbox-batch")

    @app.listener(Queue(queue, declare=False), inbox=inbox, name="bench", batch=Batch(100, 0.05))
    def handle(bodies: list[bytes], ds: list[Delivery]) -> None:
        with ds[0].db.cursor() as cur:
            cur.executemany(f"INSERT INTO {table} (msg) VALUES (%s)", [(d.message_id,) for d in ds])

    _run_app_until(app, n, lambda s: s.get("acked", 0))
