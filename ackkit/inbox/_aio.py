"""The AsyncApp's inbox shell: the runner's scripts (`_run.Runner`) carried out on the
event loop, with psycopg's AsyncConnection (the handler must be `async def`); the
listener it serves is an `AsyncHost`."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .._app.invocation import Invocation
from .._core.inbox import DatabaseDown
from .._messages.publish import Outgoing
from . import _run
from ._options import Inbox
from ._outbox import arelay_once, to_row
from ._relay import arelay_connection
from ._run import Runner, log
from ._script import Script, T, adrive, on_aconnection
from ._sql import enqueue as enqueue_sql

if TYPE_CHECKING:
    from .._messages.delivery import DeliveryBase
    from ._host import AsyncHost

RELAY_CANCEL_WAIT = 2.0
"""Seconds a stop waits for a relay it cancelled (its DELETE of confirmed rows runs on)."""
_CURRENT: contextvars.ContextVar[list[Any] | None] = contextvars.ContextVar(
    "ackkit_inbox_tx", default=None
)
"""[transaction, wrote to the outbox] of the inbox handler running in this task."""


class AsyncInbox:
    """One AsyncApp listener's inbox: its store, its probe, retention and relay tasks."""

    def __init__(self, inbox: Inbox, host: AsyncHost) -> None:
        self.inbox = inbox
        self.host = host
        self.name = host.name
        self.memory: Any = None
        self.store: Any = None
        if inbox.in_memory:
            from ._memory import MemoryStore, memory_fault

            self.memory = MemoryStore(inbox)
            fault: Any = memory_fault
        else:
            from ._pg import AsyncPgStore, fault

            self.store = AsyncPgStore(inbox)
        self._kick = asyncio.Event()
        self.run = Runner(inbox, self.name, fault, self._kick.set, (asyncio.CancelledError,))
        self._probe: asyncio.Task[Any] | None = None
        self._retention: asyncio.Task[Any] | None = None
        self._relay: asyncio.Task[Any] | None = None
        self._sending = False  # the relay is in a round (`finish`)
        self._sql = on_aconnection()

    def _transaction(self) -> Any:
        return self.memory.atransaction() if self.memory is not None else self.store.transaction()

    def started(self) -> None:
        """The listener's channel is open (on the loop): its background tasks run."""
        if self._retention is None and self.inbox.retention is not None:
            self._retention = self._task(self.run.retention)
        if self._relay is None and self.store is not None:
            self._relay = self._task(self.run.relay)

    def _task(self, script: Callable[[], Script[None]]) -> asyncio.Task[Any]:
        return self.host.spawn(self._drive(script()))

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

    # -- what the runner asks ----------------------------------------------------------

    async def _drive(self, script: Script[T]) -> T:
        return await adrive(script, self._do)

    async def _do(self, req: Any) -> Any:
        kind = type(req)
        if kind is _run.InTx:
            async with self._transaction() as tx:
                return await self._drive(req.body(tx))
        if kind is _run.OnTx:
            return await getattr(req.tx, "a" + req.op)(self.name, req.arg)
        if kind is _run.Handler:
            cur: list[Any] = [req.tx, False]
            token = _CURRENT.set(cur)
            try:
                return await req.fn(*req.args), cur[1]
            finally:
                _CURRENT.reset(token)
        if kind is _run.Wait:
            return await self.host.wait(req.seconds)
        if kind is _run.Decide:
            return await self.host.decide(req.fn)
        if kind is _run.Stopping:
            return self.host.stopping
        if kind is _run.Nap:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._kick.wait(), req.seconds)
            self._kick.clear()
            return None
        if req is _run.CONNECT:
            return await arelay_connection(self.inbox)
        if kind is _run.Round:
            self._sending = True
            try:
                return await arelay_once(
                    req.conn, self.inbox.outbox_table, self.host.publish, self._stopping
                )
            finally:
                self._sending = False
        if kind is _run.Close:
            return await req.conn.close()
        return await self._sql(req)

    def _stopping(self) -> bool:  # then no batch after the one it is sending
        return self.host.stopping

    # -- the listener's calls ------------------------------------------------------------

    async def call(self, inv: Invocation) -> object:
        """See `Runner.call`."""
        self.started()
        return await self._drive(self.run.call(inv))

    async def look_up(self, d: DeliveryBase) -> str | DatabaseDown | None:
        """See `Runner.look_up`."""
        self.started()
        return await self._drive(self.run.look_up(d))

    async def down(self, inv: Invocation, why: BaseException) -> None:
        """Return `inv`'s deliveries unstarted, pause the listener, probe until the
        database answers, then resume (`Runner.down`)."""
        if await self._drive(self.run.down(inv, why)):
            self._probe = self._task(self.run.probe)

    async def expire_now(self) -> int:
        """See `Runner.expire_now`."""
        return await self._drive(self.run.expire_now())

    async def enqueue(self, msg: Outgoing) -> bool:
        """`SyncInbox.enqueue` on the event loop."""
        cur = _CURRENT.get()
        if cur is None or cur[0].db is None:
            return False
        await cur[0].db.execute(enqueue_sql(self.inbox.outbox_table), to_row(msg))
        cur[1] = True
        return True
