"""The App's inbox shell: the runner's scripts (`_run.Runner`) carried out on threads,
with psycopg's Connection; the listener it serves is a `SyncHost`."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .._app.invocation import Invocation
from .._core.inbox import DatabaseDown
from .._messages.publish import Outgoing
from . import _run
from ._options import Inbox
from ._outbox import relay_once, to_row
from ._relay import relay_connection
from ._run import Runner
from ._script import Script, T, drive, on_connection
from ._sql import enqueue as enqueue_sql

if TYPE_CHECKING:
    from .._messages.delivery import Delivery
    from ._host import SyncHost


def _store(inbox: Inbox) -> tuple[Any, Any]:
    if inbox.in_memory:
        from ._memory import MemoryStore, memory_fault

        return MemoryStore(inbox), memory_fault
    from ._pg import PgStore, fault

    return PgStore(inbox), fault


class SyncInbox:
    """One App listener's inbox: its store, its probe, retention and relay threads."""

    def __init__(self, inbox: Inbox, host: SyncHost) -> None:
        self.inbox = inbox
        self.host = host
        self.name = host.name
        self.store, fault = _store(inbox)
        self.stop = threading.Event()
        self._kick = threading.Event()
        self.run = Runner(inbox, self.name, fault, self._kick.set)
        self._probe: threading.Thread | None = None
        self._retention: threading.Thread | None = None
        self._current = threading.local()  # .tx: the transaction of the handler running here
        self._relay: threading.Thread | None = None
        self._sql = on_connection()

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> None:
        if self.inbox.retention is not None:
            self._retention = self._thread("retention", self.run.retention)
        if not self.inbox.in_memory:
            self._relay = self._thread("outbox", self.run.relay)

    def _thread(self, what: str, script: Callable[[], Script[None]]) -> threading.Thread:
        th = threading.Thread(
            target=lambda: self._drive(script()), name=f"ackkit-{self.name}-{what}", daemon=True
        )
        th.start()
        return th

    def close(self) -> None:
        self.stop.set()
        self._kick.set()
        for th in (self._probe, self._retention, self._relay):
            if th is not None:
                th.join(5.0)
        self.store.close()

    # -- what the runner asks ----------------------------------------------------------

    def _drive(self, script: Script[T]) -> T:
        return drive(script, self._do)

    def _do(self, req: Any) -> Any:
        kind = type(req)
        if kind is _run.InTx:
            with self.store.transaction() as tx:
                return self._drive(req.body(tx))
        if kind is _run.OnTx:
            return getattr(req.tx, req.op)(self.name, req.arg)
        if kind is _run.Handler:
            cur = self._current
            cur.tx, cur.wrote = req.tx, False
            try:
                return req.fn(*req.args), cur.wrote
            finally:
                cur.tx = None
        if kind is _run.Wait:
            return self.stop.wait(req.seconds) if req.background else self.host.wait(req.seconds)
        if kind is _run.Decide:
            return self.host.decide(req.fn)
        if kind is _run.Stopping:
            return self.stop.is_set()
        if kind is _run.Nap:
            self._kick.wait(req.seconds)
            self._kick.clear()
            return None
        if req is _run.CONNECT:
            return relay_connection(self.inbox)
        if kind is _run.Round:
            return relay_once(
                req.conn, self.inbox.outbox_table, self.host.publish, self.stop.is_set
            )
        if kind is _run.Close:
            return req.conn.close()
        return self._sql(req)

    # -- the listener's calls ------------------------------------------------------------

    def call(self, inv: Invocation) -> object:
        """See `Runner.call`."""
        return self._drive(self.run.call(inv))

    def look_up(self, d: Delivery) -> str | DatabaseDown | None:
        """See `Runner.look_up`."""
        return self._drive(self.run.look_up(d))

    def down(self, inv: Invocation, why: BaseException) -> None:
        """Return `inv`'s deliveries unstarted, pause the listener, probe until the
        database answers, then resume (`Runner.down`)."""
        if self._drive(self.run.down(inv, why)):
            self._probe = self._thread("dbprobe", self.run.probe)

    def expire_now(self) -> int:
        """See `Runner.expire_now`."""
        return self._drive(self.run.expire_now())

    def enqueue(self, msg: Outgoing) -> bool:
        """`Delivery.publish` / `reply` in this listener's handler: written to the outbox
        in its transaction (True), or not in a PostgreSQL transaction (False: publish)."""
        tx = getattr(self._current, "tx", None)
        if tx is None or tx.db is None:
            return False
        tx.db.execute(enqueue_sql(self.inbox.outbox_table), to_row(msg))
        self._current.wrote = True
        return True
