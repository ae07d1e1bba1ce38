"""The PostgreSQL store of the inbox (psycopg 3): connections, one transaction per
handler call, and what a psycopg error means (`ackkit._core.inbox.fault_of`)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

from .._core.inbox import MISSING_TABLE_STATES, Fault, fault_of
from ._errors import SwallowedDatabaseError
from ._options import Inbox
from ._script import Atomic, Script, Sql, adrive, drive, on_aconnection, on_connection
from ._sql import (
    SCHEMA_LOCK,
    claim,
    claim_all,
    schema,
    tables_present,
    unclaim,
)

try:
    import psycopg
except ImportError as exc:  # pragma: no cover - the extra is missing
    raise ImportError(
        "ackkit's PostgreSQL inbox needs psycopg 3: pip install 'ackkit[postgres]'"
    ) from exc


class ConnectError(Exception):
    """Opening a connection failed (the database counts as down)."""


class TablesMissing(ConnectError):
    """A table of the inbox is not there (`Inbox(create_tables=False)` before the
    migration ran, or a table dropped): an environment fault, never the message's. The
    database counts as down: deliveries go back unstarted and the listener stands by,
    probing, until the table exists."""


def missing_tables(inbox: Inbox, present: tuple[Any, ...] | None) -> TablesMissing | None:
    """The error naming the tables of `inbox` that `present` (inbox, outbox) says are
    missing, or None."""
    present = present or (False, False)
    names = [t for t, ok in zip((inbox.table, inbox.outbox_table), present, strict=True) if not ok]
    if not names:
        return None
    return TablesMissing(
        f"table {' and '.join(names)} does not exist: run the migration that creates the "
        "inbox's tables (the SQL of ackkit.inbox.schema()) or use Inbox(create_tables=True); "
        "the listener stands by until then"
    )


def connecting(inbox: Inbox) -> dict[str, Any]:
    """The options of a store's connections (autocommit: the store opens transactions)."""
    return {"autocommit": True, "connect_timeout": max(1, round(inbox.connect_timeout))}


def make_tables(inbox: Inbox, conn: Any) -> Script[None]:
    """Create `inbox`'s tables on `conn` if they are missing (one transaction; concurrent
    CREATE IF NOT EXISTS can collide, hence the lock)."""
    yield Atomic(conn, (SCHEMA_LOCK, schema(inbox.table, inbox.outbox_table)))


def prepare(inbox: Inbox, conn: Any) -> Script[None]:
    """A store's first connection: the tables made (`create_tables`), else looked for
    (TablesMissing when one is not there)."""
    if inbox.create_tables:
        yield from make_tables(inbox, conn)
        return
    row = yield Sql(conn, tables_present(), (inbox.table, inbox.outbox_table), "one")
    missing = missing_tables(inbox, row)
    if missing is not None:
        raise missing


def gone_tables(inbox: Inbox, conn: Any) -> Script[TablesMissing | None]:
    """After a statement failed for a missing table: the error when it is one of the
    inbox's (None: the handler's own table, or the look failed)."""
    try:
        row = yield Sql(conn, tables_present(), (inbox.table, inbox.outbox_table), "one")
    except psycopg.Error:
        return None
    return missing_tables(inbox, row)


def _missing_table_error(exc: BaseException) -> bool:
    """`exc` (or the error it was raised from) says a table or schema does not exist."""
    err = exc if isinstance(exc, psycopg.Error) else exc.__cause__
    return isinstance(err, psycopg.Error) and err.sqlstate in MISSING_TABLE_STATES


def fault(exc: BaseException, conn: Any = None) -> Fault:
    """What `exc` (raised in a transaction on `conn`) means for the message."""
    if isinstance(exc, ConnectError):
        return Fault.DOWN
    err = exc if isinstance(exc, psycopg.Error) else exc.__cause__
    if not isinstance(err, psycopg.Error):
        return Fault.HANDLER
    lost = conn is not None and (conn.closed or conn.broken)
    if isinstance(err, psycopg.OperationalError) and err.sqlstate is None:
        lost = True  # the server went away before answering
    return fault_of(err.sqlstate, connection_lost=lost, connecting=False)


class PgTx:
    """One open transaction: the handler's connection and the key claim."""

    __slots__ = ("db", "inbox")

    def __init__(self, db: Any, inbox: Inbox) -> None:
        self.db = db
        self.inbox = inbox

    def claim(self, listener: str, key: str) -> bool:
        return self.db.execute(claim(self.inbox.table), (listener, key)).fetchone() is not None

    def claim_all(self, listener: str, keys: list[str]) -> set[str]:
        """Claim `keys` in their order (one statement); the ones newly recorded."""
        rows = self.db.execute(claim_all(self.inbox.table), (listener, keys)).fetchall()
        return {r[0] for r in rows}

    def unclaim(self, listener: str, keys: tuple[str, ...]) -> None:
        self.db.execute(unclaim(self.inbox.table), (listener, list(keys)))

    def check(self) -> None:
        status = self.db.info.transaction_status
        if status == psycopg.pq.TransactionStatus.INERROR:
            raise SwallowedDatabaseError(
                "the handler caught a database error and returned; its transaction is "
                "aborted and rolled back (re-raise database errors in an inbox handler)"
            )


class AsyncPgTx(PgTx):
    __slots__ = ()

    async def aclaim(self, listener: str, key: str) -> bool:
        cur = await self.db.execute(claim(self.inbox.table), (listener, key))
        return await cur.fetchone() is not None

    async def aclaim_all(self, listener: str, keys: list[str]) -> set[str]:
        cur = await self.db.execute(claim_all(self.inbox.table), (listener, keys))
        return {r[0] for r in await cur.fetchall()}

    async def aunclaim(self, listener: str, keys: tuple[str, ...]) -> None:
        await self.db.execute(unclaim(self.inbox.table), (listener, list(keys)))


class PgStore:
    """Connections of one listener (one per concurrent handler, kept open)."""

    def __init__(self, inbox: Inbox) -> None:
        self.inbox = inbox
        self._idle: list[Any] = []
        self._lock = threading.Lock()
        self._ready = False

    def _connect(self) -> Any:
        try:
            conn = psycopg.connect(self.inbox.dsn, **connecting(self.inbox))
        except psycopg.Error as exc:
            raise ConnectError(str(exc)) from exc
        if not self._ready:
            try:
                drive(prepare(self.inbox, conn), on_connection())
            except BaseException:
                conn.close()
                raise
        self._ready = True
        return conn

    @contextlib.contextmanager
    def transaction(self) -> Iterator[PgTx]:
        with self._lock:
            conn = self._idle.pop() if self._idle else None
        if conn is None or conn.closed or conn.broken:
            conn = self._connect()
        ok = False
        try:
            with conn.transaction():
                yield PgTx(conn, self.inbox)
            ok = True
        except Exception as exc:
            if _missing_table_error(exc):
                self._tables_gone(conn, exc)  # or the handler's own table: its failure
            raise
        finally:
            if ok or not (conn.closed or conn.broken):
                with self._lock:
                    self._idle.append(conn)
            else:
                conn.close()

    def _tables_gone(self, conn: Any, exc: Exception) -> None:
        """TablesMissing (from `exc`) when a table of the inbox is gone; the next
        connection looks for them again (or makes them)."""
        missing = drive(gone_tables(self.inbox, conn), on_connection())
        if missing is not None:
            self._ready = False
            raise missing from exc

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for c in idle:
            with contextlib.suppress(Exception):
                c.close()


class AsyncPgStore:
    """The asyncio flavour: psycopg AsyncConnections, one per concurrent handler."""

    def __init__(self, inbox: Inbox) -> None:
        self.inbox = inbox
        self._idle: list[Any] = []
        self._ready = False

    async def _connect(self) -> Any:
        try:
            conn = await psycopg.AsyncConnection.connect(self.inbox.dsn, **connecting(self.inbox))
        except psycopg.Error as exc:
            raise ConnectError(str(exc)) from exc
        if not self._ready:
            try:
                await adrive(prepare(self.inbox, conn), on_aconnection())
            except BaseException:
                await conn.close()
                raise
        self._ready = True
        return conn

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[AsyncPgTx]:
        conn = self._idle.pop() if self._idle else None
        if conn is None or conn.closed or conn.broken:
            conn = await self._connect()
        ok = False
        try:
            async with conn.transaction():
                yield AsyncPgTx(conn, self.inbox)
            ok = True
        except Exception as exc:
            if _missing_table_error(exc):
                await self._tables_gone(conn, exc)  # or the handler's own table
            raise
        finally:
            if ok or not (conn.closed or conn.broken):
                self._idle.append(conn)
            else:
                await conn.close()

    async def _tables_gone(self, conn: Any, exc: Exception) -> None:
        """TablesMissing (from `exc`) when a table of the inbox is gone."""
        missing = await adrive(gone_tables(self.inbox, conn), on_aconnection())
        if missing is not None:
            self._ready = False
            raise missing from exc

    async def close(self) -> None:
        idle, self._idle = self._idle, []
        for c in idle:
            with contextlib.suppress(Exception):
                await c.close()
