"""The outbox relay on its own (`ackkit outbox relay`): the rounds of `relay_once` over
one PostgreSQL connection and one confirming AMQP connection, until told to stop, or
one round (`once`). Failures are logged and retried with backoff: rows stay in the
outbox until the broker confirmed them. Given several node addresses (a cluster), the
relay connects to the first that answers; after a failure, its next connection starts
with the next address, so a dead node is not the first one tried again."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Sequence
from typing import Any

from .._connection import addresses
from .._connection.salvage import describe
from .._core.inbox import probe_delay
from ._options import Inbox
from ._outbox import log, relay_once
from ._script import adrive, drive, on_aconnection, on_connection

RELAY_POLL = 1.0
"""Seconds between the relay's looks at the outbox when no commit woke it."""


def relay_connection(inbox: Inbox) -> Any:
    """An autocommit psycopg connection for the relay (the tables made if missing and
    `inbox.create_tables`)."""
    import psycopg

    from ._pg import make_tables

    conn = psycopg.connect(inbox.dsn, autocommit=True, connect_timeout=5)
    if inbox.create_tables:
        try:
            drive(make_tables(inbox, conn), on_connection())
        except BaseException:
            conn.close()
            raise
    return conn


async def arelay_connection(inbox: Inbox) -> Any:
    """`relay_connection`, an AsyncConnection (the AsyncApp's relay)."""
    import psycopg

    from ._pg import make_tables

    conn = await psycopg.AsyncConnection.connect(inbox.dsn, autocommit=True, connect_timeout=5)
    if inbox.create_tables:
        try:
            await adrive(make_tables(inbox, conn), on_aconnection())
        except BaseException:
            await conn.close()
            raise
    return conn


def run_relay(
    url: str | Sequence[str],
    inbox: Inbox,
    *,
    once: bool = False,
    stop: threading.Event | None = None,
    poll: float = RELAY_POLL,
) -> int:
    """Send `inbox`'s outbox rows to the broker at `url` with confirms until `stop` is
    set (after the round in progress), or send what is there and return (`once`: a
    failure then raises). Returns how many messages were sent.

    `url`: one URL, the comma form or a list of a cluster's node addresses
    (`ackkit._connection.addresses`)."""
    from .._sync.pull import PullConnection

    rotation = addresses.Rotation(addresses.parse(url))
    halt = stop if stop is not None else threading.Event()
    db: Any = None
    amqp: PullConnection | None = None
    total = fails = 0
    try:
        while not halt.is_set():
            try:
                if db is None or db.closed or db.broken:
                    db = relay_connection(inbox)
                if amqp is None:
                    # every address, once around, from the rotation's current one
                    at = rotation.index
                    amqp = PullConnection(rotation.urls[at:] + rotation.urls[:at])
                n = relay_once(db, inbox.outbox_table, amqp.publish_message, halt.is_set)
                total += n
                fails = 0
                if n:
                    log.info("outbox relay: %d sent", n)
            except Exception as exc:
                if once:
                    raise
                fails += 1
                log.warning("outbox relay: %s (rows kept, sent later)", describe(exc))
                if amqp is not None:
                    with contextlib.suppress(Exception):
                        amqp.close()
                    amqp = None
                rotation.advance()  # any node serves: start with the next one next time
            if once or halt.wait(probe_delay(fails) if fails else poll):
                break
    finally:
        if amqp is not None:
            with contextlib.suppress(Exception):
                amqp.close()
        if db is not None:
            db.close()
    return total
