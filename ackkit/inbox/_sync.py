"""The App's inbox runner: each handler call in a transaction that records its key,
transient database errors retried in process, a database that is down pausing the
listener (`_core.inbox` decides; this module carries it out on threads)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from .._app.invocation import Invocation
from .._connection.salvage import describe
from .._core.inbox import DatabaseDown, probe_delay, retention_batches
from .._core.outcome import succeeded
from .._messages.publish import Outgoing
from ._options import Inbox
from ._outbox import relay_once, to_row
from ._relay import RELAY_POLL, relay_connection
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
from ._sql import enqueue as enqueue_sql

if TYPE_CHECKING:
    from .._messages.delivery import Delivery
    from .._sync.consumer import Consumer

T = TypeVar("T")


class _Unrecorded(Exception):
    """Rolls back a look-up's transaction (`SyncInbox.look_up`)."""


def _store(inbox: Inbox) -> tuple[Any, Any]:
    if inbox.in_memory:
        from ._memory import MemoryStore, memory_fault

        return MemoryStore(inbox), memory_fault
    from ._pg import PgStore, fault

    return PgStore(inbox), fault


class SyncInbox:
    """One App listener's inbox: its store, its probe and retention threads."""

    def __init__(self, inbox: Inbox, c: Consumer) -> None:
        self.inbox = inbox
        self.c = c
        self.name = c.spec.name
        self.store, self.fault = _store(inbox)
        self.stop = threading.Event()
        self.paused_by_db = False
        """The listener was consuming when the database went down: resume it when it answers."""
        self._probe: threading.Thread | None = None
        self._probing = False
        """A probe is on its way to resume the listener (under the consumer's lock): a
        down() meanwhile needs none of its own; once it resumed, a down() starts one."""
        self._retention: threading.Thread | None = None
        self._current = threading.local()  # .tx: the transaction of the handler running here
        self._kick = threading.Event()
        self._relay: threading.Thread | None = None

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> None:
        if self.inbox.retention is not None:
            self._retention = threading.Thread(
                target=self._expire_loop, name=f"ackkit-{self.name}-retention", daemon=True
            )
            self._retention.start()
        if not self.inbox.in_memory:
            self._relay = threading.Thread(
                target=self._relay_loop, name=f"ackkit-{self.name}-outbox", daemon=True
            )
            self._relay.start()

    def close(self) -> None:
        self.stop.set()
        self._kick.set()
        for th in (self._probe, self._retention, self._relay):
            if th is not None:
                th.join(5.0)
        self.store.close()

    # -- one handler call ----------------------------------------------------------------

    def call(self, inv: Invocation) -> object:
        """Run the handler for `inv` in a transaction; None for a duplicate (acked
        without running). Raises what the handler raised (rolled back), DeadLetterMessage
        for a message without a key, DatabaseDown when the database cannot be reached."""
        if inv.binding.batch:
            return self._call_batch(inv)
        d = inv.deliveries[0]
        key = guard_key(self.inbox, d)
        try:
            return self._retrying(lambda tx_ref: self._once(inv, key, tx_ref))
        except Duplicate:
            with self.c.lock:
                duplicate(self.c.core, self.name, d, key or "")
            return None

    def _call_batch(self, inv: Invocation) -> object:
        """A batch in one transaction (`_core.inbox.end_batch` has the rules). Leaves
        `inv` with the deliveries the listener's rules settle; the duplicates are settled
        here. DatabaseDown leaves `inv` whole (all returned unstarted)."""
        b = BatchTry(self.inbox, list(inv.deliveries))
        try:
            result = self._retrying(lambda tx_ref: self._once_batch(inv, b, tx_ref))
        except DatabaseDown:
            raise
        except BaseException:
            self._apart(b, inv)  # rolled back: only the recorded keys are duplicates
            raise
        self._apart(b, inv)
        return result

    def _apart(self, b: BatchTry, inv: Invocation) -> None:
        c = self.c
        with c.lock:
            acts = b.apart(c.core, self.name, inv)
            if acts:
                c.send(acts)

    def _once_batch(self, inv: Invocation, b: BatchTry, tx_ref: list[Any]) -> object:
        b.begin()
        with self.store.transaction() as tx:
            tx_ref.append(tx.db)
            run = b.claimed(tx.claim_all(self.name, b.claims) if b.claims else set())
            result: object = None
            if run:
                ds = [inv.deliveries[i] for i in run]
                set_db(ds, tx.db)
                self._current.tx = tx
                self._current.wrote = False
                try:
                    result = inv.binding.fn(*inv.args_of(run))
                finally:
                    set_db(ds, None)
                    self._current.tx = None
                tx.check()
            end = b.returned(succeeded(result, len(run), True))
            if end.unrecord:
                tx.unclaim(self.name, end.unrecord)
        if run and self._current.wrote:
            self._kick.set()
        return result

    def look_up(self, d: Delivery) -> str | DatabaseDown | None:
        """A redelivery the core would charge or dead-letter (`LostRuns.look_up_first`):
        is its key recorded already? The key when it is (the attempt loop finishes `d`
        as a duplicate); None when it is not, when `d` has no key to look up, or when the
        look-up failed otherwise (the run meets that too); the DatabaseDown when the
        database cannot be reached. The key is claimed in a transaction rolled back at
        once, so a twin's transaction holding it is waited for, as the handler's claim
        would be."""
        key = look_up_key(self.inbox, d)
        if key is None:
            return None
        try:
            self._retrying(lambda tx_ref: self._look_up(key, tx_ref))
        except Duplicate:
            return key
        except DatabaseDown as e:
            return e
        except Exception as e:  # a broken inbox table: the run will meet it too
            log.warning("%s: inbox look-up failed: %s", self.name, describe(e))
        return None

    def _retrying(self, once: Callable[[list[Any]], T]) -> T:
        """`once(tx_ref)` (it opens a transaction), tried again after a transient error."""
        done = 0
        while True:
            tx_ref: list[Any] = []
            try:
                return once(tx_ref)
            except Duplicate:
                raise
            except Exception as exc:
                done += 1
                fault = self.fault(exc, tx_ref[0] if tx_ref else None)
                wait = retry_after(self.name, fault, exc, done)  # or raises
                if self.c.rt.stop_event.wait(wait):
                    raise DatabaseDown("the app is stopping") from exc

    def _look_up(self, key: str, tx_ref: list[Any]) -> None:
        with contextlib.suppress(_Unrecorded), self.store.transaction() as tx:
            tx_ref.append(tx.db)
            if not tx.claim(self.name, key):
                raise Duplicate
            raise _Unrecorded  # rolls the claim back: a look-up records nothing

    def _once(self, inv: Invocation, key: str | None, tx_ref: list[Any]) -> object:
        ds = inv.deliveries
        with self.store.transaction() as tx:
            tx_ref.append(tx.db)
            if key is not None and not tx.claim(self.name, key):
                raise Duplicate
            set_db(ds, tx.db)
            self._current.tx = tx
            self._current.wrote = False
            try:
                result = inv.binding.fn(*inv.args())
            finally:
                set_db(ds, None)
                self._current.tx = None
            tx.check()
        if self._current.wrote:
            self._kick.set()  # committed: the relay sends now, not at its next poll
        return result

    # -- the outbox ---------------------------------------------------------------------

    def enqueue(self, msg: Outgoing) -> bool:
        """`Delivery.publish` / `reply` in this listener's handler: written to the outbox
        in its transaction (True), or not in a PostgreSQL transaction (False: publish)."""
        tx = getattr(self._current, "tx", None)
        if tx is None or tx.db is None:
            return False
        tx.db.execute(enqueue_sql(self.inbox.outbox_table), to_row(msg))
        self._current.wrote = True
        return True

    def _relay_loop(self) -> None:
        conn: Any = None
        fails = 0
        while not self.stop.is_set():
            self._kick.wait(RELAY_POLL if not fails else probe_delay(fails))
            self._kick.clear()
            if self.stop.is_set():
                break
            try:
                if conn is None or conn.closed or conn.broken:
                    conn = relay_connection(self.inbox)
                relay_once(conn, self.inbox.outbox_table, self.c.rt.publish, self.stop.is_set)
                fails = 0
            except Exception as exc:
                fails += 1
                log.warning(
                    "%s: outbox relay: %s (rows kept, sent later)", self.name, describe(exc)
                )
        if conn is not None:
            conn.close()

    # -- the database is down ---------------------------------------------------------

    def down(self, inv: Invocation, why: BaseException) -> None:
        """Return `inv`'s deliveries unstarted, pause the listener, probe until the
        database answers, then resume."""
        c = self.c
        ts = [d._tracked for d in inv.deliveries]
        with c.lock:
            if not c.core.gating.flow.paused:  # paused by hand before: left to the hand
                self.paused_by_db = True
            acts = c.core.gating.set_paused(True, f"inbox database down: {why}", returning=ts)
            if acts:
                c.queue(acts)  # in decision order; the I/O thread sends
            # Decided with the pause, under the lock the probe resumes under: a probe that
            # resumed already, and is only finishing, no longer counts (it left a down()
            # after its resume paused with no probe, deliveries held for ever).
            probe, self._probing = not self._probing, True
        if probe:
            log.error(
                "%s: inbox database unreachable (%s): listener paused, deliveries "
                "returned unstarted (not attempts); probing until it answers",
                self.name,
                why,
            )
            self._probe = threading.Thread(
                target=self._probe_loop, name=f"ackkit-{self.name}-dbprobe", daemon=True
            )
            self._probe.start()
        if acts:
            c.rt.call_soon(c.flush)

    def _probe_loop(self) -> None:
        n = 0
        while not self.stop.wait(probe_delay(n)):
            n += 1
            if self.store.ping():
                log.warning("%s: inbox database answers again: listener resumed", self.name)
                with self.c.lock:
                    self._probing = False  # a down() from now on starts a probe of its own
                    mine, self.paused_by_db = self.paused_by_db, False
                    acts = (
                        self.c.core.gating.set_paused(False, "inbox database answers again")
                        if mine
                        else None
                    )
                    if acts:
                        self.c.queue(acts)
                if acts:
                    self.c.rt.call_soon(self.c.flush)
                return

    # -- retention ------------------------------------------------------------------------

    def _expire_loop(self) -> None:
        while not self.stop.wait(self.inbox.retention_interval):
            self.expire_now()

    def expire_now(self) -> int:
        """Delete expired keys in batches until a batch comes back short; how many."""
        from ._retention import expire_batch

        total = 0
        while not self.stop.is_set():
            try:
                n = expire_batch(self.store, self.inbox)
            except Exception as exc:
                log.warning("%s: inbox retention failed: %s", self.name, describe(exc))
                return total
            total += n
            if not retention_batches(n, self.inbox.retention_batch):
                return total
        return total
