"""The outbox: messages written in the handler's (or your own) transaction, sent by a
relay after the commit, with publisher confirms, oldest first, then deleted.

Inside an inbox listener's handler, `Delivery.publish` / `reply` write to the outbox
table in the handler's transaction instead of publishing. Code outside listeners writes
with `enqueue(conn, ...)` (`aenqueue` for an AsyncConnection) in a transaction of its
own; an app with an inbox listener on the same database relays those too.

Guarantees: a message is sent only if its transaction committed; a crash between
commit and send loses nothing (the relay sends it when it runs again); a crash between
the broker's confirm and the row's deletion sends it again with the same message_id
(an inbox downstream absorbs it). One relay sends at a time (a PostgreSQL advisory
lock), in the order the rows were written: each destination sees its messages in
commit order as long as they were written by one transaction at a time.
"""

from __future__ import annotations

import base64
import json
import logging
import time
import uuid
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

from .._core.outbox import Holds, missing_exchange
from .._messages.publish import Outgoing, outgoing
from ._script import Publish, Script, Sql, adrive, drive, on_aconnection, on_connection
from ._script import to_the_end as to_the_end
from ._sql import RELAY_LOCK, RELAY_UNLOCK, pending, sent
from ._sql import enqueue as enqueue_sql

log = logging.getLogger("ackkit.inbox")

BATCH = 100
_BYTES = "$bytes"


def _jsonable(value: Any, where: str) -> Any:
    if isinstance(value, bytes | bytearray):
        return {_BYTES: base64.b64encode(bytes(value)).decode()}
    if isinstance(value, dict):
        return {str(k): _jsonable(v, where) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v, where) for v in value]
    if value is None or isinstance(value, str | int | float | bool):
        return value
    raise TypeError(
        f"outbox {where}: a {type(value).__name__} cannot be stored; use JSON values or bytes"
    )


def _from_json(value: Any) -> Any:
    if isinstance(value, dict):
        if set(value) == {_BYTES}:
            return base64.b64decode(value[_BYTES])
        return {k: _from_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_from_json(v) for v in value]
    return value


def with_id(msg: Outgoing) -> Outgoing:
    """`msg` with a message_id: its own, else a new uuid4().hex (also for message_id=None).
    An outbox message may be sent twice (a crash between the confirm and the row's
    deletion); its id is what lets a consumer know the second one."""
    if msg.properties.get("message_id") is not None:
        return msg
    return replace(msg, properties={**msg.properties, "message_id": uuid.uuid4().hex})


def to_row(msg: Outgoing) -> tuple[str, str, bytes, str]:
    """The outbox row of a message (exchange, routing key, body, properties as JSON),
    always with a message_id (`with_id`)."""
    props = dict(with_id(msg).properties)
    props["$mandatory"] = msg.mandatory
    return msg.exchange, msg.routing_key, msg.body, json.dumps(_jsonable(props, "properties"))


def from_row(exchange: str, routing_key: str, body: bytes, properties: Any) -> Outgoing:
    props = _from_json(properties if isinstance(properties, dict) else json.loads(properties))
    mandatory = bool(props.pop("$mandatory", True))
    return Outgoing(exchange, routing_key, bytes(body), props, mandatory)


def enqueue(
    conn: Any, routing_key: str, body: object, *, table: str = "ackkit_outbox", **options: Any
) -> str:
    """Write a message to the outbox in `conn`'s current transaction (psycopg
    Connection): sent by a relay after the commit, never if it rolls back. The options
    of `App.publish` (exchange, headers, message_id, ...). Returns the message_id the
    message is sent with: the one given, else a new uuid4().hex (message_id=None too:
    an outbox message always has one, see `with_id`)."""
    msg = with_id(outgoing(routing_key, body, **options))
    conn.execute(enqueue_sql(table), to_row(msg))
    return str(msg.properties["message_id"])


async def aenqueue(
    conn: Any, routing_key: str, body: object, *, table: str = "ackkit_outbox", **options: Any
) -> str:
    """`enqueue` for a psycopg AsyncConnection."""
    msg = with_id(outgoing(routing_key, body, **options))
    await conn.execute(enqueue_sql(table), to_row(msg))
    return str(msg.properties["message_id"])


_HOLDS: weakref.WeakKeyDictionary[Any, Holds] = weakref.WeakKeyDictionary()
"""A relay's held exchanges between its rounds, by its database connection."""


def _held(holds: Holds, exchange: str, rid: int, exc: Exception) -> bool:
    """`exc` says `exchange` does not exist: its rows wait (logged), True; else False."""
    if missing_exchange(exc) != exchange:
        return False
    delay = holds.missing(exchange, time.monotonic())
    log.error(
        "outbox relay: exchange %r does not exist: its messages (row %d on) stay in the "
        "outbox, tried again in %.0f s; the other rows go on. Declare the exchange "
        "(app.declare(Exchange(%r, ...)))",
        exchange,
        rid,
        delay,
        exchange,
    )
    return True


def _pending(table: str, skipped: set[str]) -> tuple[str, tuple[Any, ...]]:
    """The next batch's query and parameters, without the rows to `skipped` exchanges."""
    if skipped:
        return pending(table, skip=True), (sorted(skipped), BATCH)
    return pending(table), (BATCH,)


def _round(conn: Any, table: str, stop: Callable[[], bool] | None) -> Script[int]:
    """One relay round on `conn` (see `relay_once`), for either client."""
    if not (yield Sql(conn, RELAY_LOCK, (table,), "one"))[0]:
        return 0
    holds = _HOLDS.setdefault(conn, Holds())
    skipped: set[str] = set()
    total = 0
    try:
        while True:
            if total and stop is not None and stop():
                return total
            skipped.update(holds.waiting(time.monotonic()))
            rows = yield Sql(conn, *_pending(table, skipped), "all")
            if not rows:
                return total
            done: list[int] = []
            try:
                for rid, exchange, rk, body, props in rows:
                    if exchange in skipped:
                        continue
                    try:
                        yield Publish(from_row(exchange, rk, body, props))
                    except Exception as exc:
                        if not _held(holds, exchange, rid, exc):
                            raise
                        skipped.add(exchange)
                        continue
                    holds.sent(exchange)
                    done.append(rid)
            finally:
                if done:
                    yield Sql(conn, sent(table), (done,), whole=True)
                    total += len(done)
    finally:
        yield Sql(conn, RELAY_UNLOCK, (table,))


def relay_once(
    conn: Any,
    table: str,
    publish: Callable[[Outgoing], None],
    stop: Callable[[], bool] | None = None,
) -> int:
    """Send what the outbox holds, oldest first, in batches; delete each batch once the
    broker confirmed it (`stop()` true: no further batch). Another relay holding the
    lock: nothing (0). A publish that fails stops the round (the rest waits, in order,
    for the next one) and raises; but a row whose exchange does not exist waits with
    the later rows to that exchange (ERROR), tried again after a backoff, and the other
    rows go on (`ackkit._core.outbox`)."""
    return drive(_round(conn, table, stop), on_connection(publish))


async def arelay_once(
    conn: Any,
    table: str,
    publish: Callable[[Outgoing], Awaitable[object]],
    stop: Callable[[], bool] | None = None,
) -> int:
    """`relay_once` for an AsyncConnection and an async `publish`. The DELETE of what
    the broker confirmed runs to its end even when the task is cancelled meanwhile (then
    the cancel is raised): a cancelled DELETE left confirmed rows to be sent again."""
    return await adrive(_round(conn, table, stop), on_aconnection(publish))
