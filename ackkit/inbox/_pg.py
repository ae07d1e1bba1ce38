"""The PostgreSQL store of the inbox (psycopg 3): connections, one transaction per
handler call, and what a psycopg error means (`ackkit._core.inbox.fault_of`)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

from .._core.inbox import Fault, fault_of
from ._options import Inbox
from ._sql import SCHEMA_LOCK, claim, claim_all, schema, unclaim

try:
    import psycopg
except ImportError as exc:  # pragma: no cover - the extra is missing
    raise ImportError(
        "ackkit's PostgreSQL inbox needs psycopg 3: pip install 'ackkit[postgres]'"
    ) from exc


class ConnectError(Exception):
    """Opening a connection failed (the database counts as down)."""


class SwallowedError(Exception):
    """The handler caught a database error and returned: its transaction is aborted."""


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
            raise SwallowedError(
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
            conn = psycopg.connect(
                self.inbox.dsn,
                autocommit=True,
                connect_timeout=max(1, round(self.inbox.connect_timeout)),
            )
        except psycopg.Error as exc:
            raise ConnectError(str(exc)) from exc
        if not self._ready and self.inbox.create_tables:
            try:
                with conn.transaction():
                    conn.execute(SCHEMA_LOCK)  # concurrent CREATE IF NOT EXISTS can collide
                    conn.execute(schema(self.inbox.table, self.inbox.outbox_table))
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
        finally:
            if ok or not (conn.closed or conn.broken):
                with self._lock:
                    self._idle.append(conn)
            else:
                conn.close()

    def ping(self) -> bool:
        try:
            with self.transaction() as tx:
                tx.db.execute("SELECT 1")
        except Exception:
            return False
        return True

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
            conn = await psycopg.AsyncConnection.connect(
                self.inbox.dsn,
                autocommit=True,
                connect_timeout=max(1, round(self.inbox.connect_timeout)),
            )
        except psycopg.Error as exc:
            raise ConnectError(str(exc)) from exc
        if not self._ready and self.inbox.create_tables:
            try:
                async with conn.transaction():
                    await conn.execute(SCHEMA_LOCK)
                    await conn.execute(schema(self.inbox.table, self.inbox.outbox_table))
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
        finally:
            if ok or not (conn.closed or conn.broken):
                self._idle.append(conn)
            else:
                await conn.close()

    async def ping(self) -> bool:
        try:
            async with self.transaction() as tx:
                await tx.db.execute("SELECT 1")
        except Exception:
            return False
        return True

    async def close(self) -> None:
        idle, self._idle = self._idle, []
        for c in idle:
            with contextlib.suppress(Exception):
                await c.close()
