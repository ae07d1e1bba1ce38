"""The AsyncApp's inbox runner: `_sync.SyncInbox`'s rules on the event loop, with
psycopg's AsyncConnection (the handler must be `async def`)."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

from .._app.invocation import Invocation
from .._connection.salvage import describe
from .._core.inbox import DatabaseDown, probe_delay, retention_batches
from .._core.outcome import succeeded
from .._messages.publish import Outgoing
from ._options import Inbox
from ._outbox import arelay_once, to_row
from ._run import (
    BatchTry,
    Duplicate,
    duplicate,
    guard_key,
    log,
    look_up_key,
    retry_after,
    set_db,
)
from ._sql import SCHEMA_LOCK, expire, schema
from ._sql import enqueue as enqueue_sql

if TYPE_CHECKING:
    from .._async.consumer import AsyncConsumer
    from .._messages.delivery import DeliveryBase

T = TypeVar("T")


RELAY_POLL = 1.0
RELAY_CANCEL_WAIT = 2.0
"""Seconds a stop waits for a relay it cancelled (its DELETE of confirmed rows runs on)."""
_CURRENT: contextvars.ContextVar[list[Any] | None] = contextvars.ContextVar(
    "ackkit_inbox_tx", default=None
)
"""[transaction, wrote to the outbox] of the inbox handler running in this task."""


class _Unrecorded(Exception):
    """Rolls back a look-up's transaction (`AsyncInbox.look_up`)."""


class AsyncInbox:
    """One AsyncApp listener's inbox: its store, its probe and retention tasks."""

    def __init__(self, inbox: Inbox, c: AsyncConsumer) -> None:
        self.inbox = inbox
        self.c = c
        self.name = c.spec.name
        self.memory: Any = None
        if inbox.in_memory:
            from ._memory import MemoryStore, memory_fault

            self.memory = MemoryStore(inbox)
            self.fault: Any = memory_fault
            self.store: Any = None
        else:
            from ._pg import AsyncPgStore, fault

            self.store = AsyncPgStore(inbox)
            self.fault = fault
        self.paused_by_db = False
        """The listener was consuming when the database went down: resume it when it answers."""
        self._probe: asyncio.Task[Any] | None = None
        self._probing = False  # see SyncInbox._probing
        self._retention: asyncio.Task[Any] | None = None
        self._relay: asyncio.Task[Any] | None = None
        self._sending = False  # the relay is in a round (`finish`)
        self._kick = asyncio.Event()

    def _transaction(self) -> Any:
        return self.memory.atransaction() if self.memory is not None else self.store.transaction()

    def started(self) -> None:
        """The listener's channel is open (on the loop): its background tasks run."""
        if self._retention is None and self.inbox.retention is not None:
            self._retention = self.c.rt.spawn(self._expire_loop())
        if self._relay is None and self.store is not None:
            self._relay = self.c.rt.spawn(self._relay_loop())

    async def finish(self, timeout: float) -> None:
        """The app is stopping (before its connection closes): the relay takes no new
        batch and ends the one it is sending, confirmed and deleted, within `timeout`
        seconds. Past that it is cancelled: a message still waiting for its confirm stays
        in the outbox, and the next app sends it again, as after a crash."""
        t = self._relay
        if t is None or t.done():
            return
        self._kick.set()  # out of its wait at once
        if (await asyncio.wait({t}, timeout=timeout))[0]:
            return
        if self._sending:
            log.warning(
                "%s: outbox relay still sending after %.1f s: cancelled (a message not "
                "yet confirmed is sent again by the next app)",
                self.name,
                timeout,
            )
        t.cancel()
        await asyncio.wait({t}, timeout=RELAY_CANCEL_WAIT)  # its DELETE, its connection

    async def close(self) -> None:
        for t in (self._probe, self._retention, self._relay):
            if t is not None:
                t.cancel()
        if self.store is not None:
            await self.store.close()

    # -- one handler call ----------------------------------------------------------------

    async def call(self, inv: Invocation) -> object:
        """See `SyncInbox.call`."""
        self.started()
        if inv.binding.batch:
            return await self._call_batch(inv)
        d = inv.deliveries[0]
        key = guard_key(self.inbox, d)
        try:
            return await self._retrying(lambda tx_ref: self._once(inv, key, tx_ref))
        except Duplicate:
            duplicate(self.c.core, self.name, d, key or "")
            return None

    async def _call_batch(self, inv: Invocation) -> object:
        """See `SyncInbox._call_batch`."""
        b = BatchTry(self.inbox, list(inv.deliveries))
        try:
            result = await self._retrying(lambda tx_ref: self._once_batch(inv, b, tx_ref))
        except (DatabaseDown, asyncio.CancelledError):
            raise  # all returned unstarted / released as they came
        except BaseException:
            await self._apart(b, inv)
            raise
        await self._apart(b, inv)
        return result

    async def _apart(self, b: BatchTry, inv: Invocation) -> None:
        c = self.c
        acts = b.apart(c.core, self.name, inv)
        if acts:
            await c.execute(acts)

    async def _once_batch(self, inv: Invocation, b: BatchTry, tx_ref: list[Any]) -> object:
        b.begin()
        wrote = False
        async with self._transaction() as tx:
            tx_ref.append(tx.db)
            new = await tx.aclaim_all(self.name, b.claims) if b.claims else set()
            run = b.claimed(new)
            result: object = None
            if run:
                ds = [inv.deliveries[i] for i in run]
                set_db(ds, tx.db)
                cur: list[Any] = [tx, False]
                token = _CURRENT.set(cur)
                try:
                    result = await inv.binding.fn(*inv.args_of(run))
                    wrote = cur[1]
                finally:
                    set_db(ds, None)
                    _CURRENT.reset(token)
                tx.check()
            end = b.returned(succeeded(result, len(run), True))
            if end.unrecord:
                await tx.aunclaim(self.name, end.unrecord)
        if wrote:
            self._kick.set()
        return result

    async def look_up(self, d: DeliveryBase) -> str | DatabaseDown | None:
        """See `SyncInbox.look_up`."""
        self.started()
        key = look_up_key(self.inbox, d)
        if key is None:
            return None
        try:
            await self._retrying(lambda tx_ref: self._look_up(key, tx_ref))
        except Duplicate:
            return key
        except DatabaseDown as e:
            return e
        except Exception as e:  # a broken inbox table: the run will meet it too
            log.warning("%s: inbox look-up failed: %s", self.name, describe(e))
        return None

    async def _retrying(self, once: Callable[[list[Any]], Awaitable[T]]) -> T:
        """`await once(tx_ref)` (it opens a transaction), tried again after a transient
        error."""
        done = 0
        while True:
            tx_ref: list[Any] = []
            try:
                return await once(tx_ref)
            except Duplicate:
                raise
            except Exception as exc:
                done += 1
                fault = self.fault(exc, tx_ref[0] if tx_ref else None)
                wait = retry_after(self.name, fault, exc, done)  # or raises
                if await self.c.rt.pause(wait):
                    raise DatabaseDown("the app is stopping") from exc

    async def _look_up(self, key: str, tx_ref: list[Any]) -> None:
        with contextlib.suppress(_Unrecorded):
            async with self._transaction() as tx:
                tx_ref.append(tx.db)
                if not await tx.aclaim(self.name, key):
                    raise Duplicate
                raise _Unrecorded  # rolls the claim back: a look-up records nothing

    async def _once(self, inv: Invocation, key: str | None, tx_ref: list[Any]) -> object:
        ds = inv.deliveries
        async with self._transaction() as tx:
            tx_ref.append(tx.db)
            if key is not None and not await tx.aclaim(self.name, key):
                raise Duplicate
            set_db(ds, tx.db)
            cur: list[Any] = [tx, False]
            token = _CURRENT.set(cur)
            try:
                result = await inv.binding.fn(*inv.args())
                wrote = cur[1]
            finally:
                set_db(ds, None)
                _CURRENT.reset(token)
            tx.check()
        if wrote:
            self._kick.set()  # committed: the relay sends now, not at its next poll
        return result

    # -- the outbox ---------------------------------------------------------------------

    async def enqueue(self, msg: Outgoing) -> bool:
        """See `SyncInbox.enqueue`."""
        cur = _CURRENT.get()
        if cur is None or cur[0].db is None:
            return False
        await cur[0].db.execute(enqueue_sql(self.inbox.outbox_table), to_row(msg))
        cur[1] = True
        return True

    async def _relay_loop(self) -> None:
        import psycopg

        conn: Any = None
        fails = 0
        rt = self.c.rt

        def stopping() -> bool:  # then no batch after the one it is sending
            return rt.stopping

        try:
            while not rt.stopping:
                wait = RELAY_POLL if not fails else probe_delay(fails)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._kick.wait(), wait)
                self._kick.clear()
                if rt.stopping:
                    break  # what is left waits for the next app (see `finish`)
                try:
                    if conn is None or conn.closed or conn.broken:
                        conn = await psycopg.AsyncConnection.connect(
                            self.inbox.dsn, autocommit=True, connect_timeout=5
                        )
                        if self.inbox.create_tables:
                            async with conn.transaction():
                                await conn.execute(SCHEMA_LOCK)
                                ddl = schema(self.inbox.table, self.inbox.outbox_table)
                                await conn.execute(ddl)
                    self._sending = True
                    try:
                        await arelay_once(conn, self.inbox.outbox_table, rt.publish, stopping)
                    finally:
                        self._sending = False
                    fails = 0
                except Exception as exc:
                    fails += 1
                    log.warning(
                        "%s: outbox relay: %s (rows kept, sent later)", self.name, describe(exc)
                    )
        finally:
            if conn is not None:
                await conn.close()

    # -- the database is down ---------------------------------------------------------

    async def down(self, inv: Invocation, why: BaseException) -> None:
        """Return `inv`'s deliveries unstarted, pause the listener, probe until the
        database answers, then resume."""
        c = self.c
        ts = [d._tracked for d in inv.deliveries]
        if not c.core.gating.flow.paused:  # paused by hand before: left to the hand
            self.paused_by_db = True
        acts = c.core.gating.set_paused(True, f"inbox database down: {why}", returning=ts)
        # not `self._probe.done()`: a probe awaiting its resume's basic.consume has resumed
        # already, and would leave this pause with no probe (see SyncInbox.down)
        if not self._probing:
            self._probing = True
            log.error(
                "%s: inbox database unreachable (%s): listener paused, deliveries returned "
                "unstarted (not attempts); probing until it answers",
                self.name,
                why,
            )
            self._probe = c.rt.spawn(self._probe_loop())
        if acts:
            await c.execute(acts)

    async def _probe_loop(self) -> None:
        n = 0
        while not await self.c.rt.pause(probe_delay(n)):
            n += 1
            if self.store is None or await self.store.ping():
                log.warning("%s: inbox database answers again: listener resumed", self.name)
                self._probing = False  # a down() from now on starts a probe of its own
                mine, self.paused_by_db = self.paused_by_db, False
                if mine:
                    core = self.c.core
                    acts = core.gating.set_paused(False, "inbox database answers again")
                    await self.c.execute(acts)
                return

    # -- retention ------------------------------------------------------------------------

    async def _expire_loop(self) -> None:
        while not await self.c.rt.pause(self.inbox.retention_interval):
            await self.expire_now()

    async def expire_now(self) -> int:
        """Delete expired keys in batches until a batch comes back short; how many."""
        total = 0
        batch = self.inbox.retention_batch
        older = float(self.inbox.retention or 0)
        while True:
            try:
                if self.memory is not None:
                    n = int(self.memory.store.expire(older, batch))
                else:
                    async with self.store.transaction() as tx:
                        cur = await tx.db.execute(expire(self.inbox.table), (older, batch))
                        n = int(cur.rowcount)
            except Exception as exc:
                log.warning("%s: inbox retention failed: %s", self.name, describe(exc))
                return total
            total += n
            if not retention_batches(n, batch):
                return total
