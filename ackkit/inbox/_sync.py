"""The App's inbox runner: each handler call in a transaction that records its key,
transient database errors retried in process, a database that is down pausing the
listener (`_core.inbox` decides; this module carries it out on threads)."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from .._core.inbox import TRANSACTION_RETRY, Fault, probe_delay, retention_batches
from .._core.outcome import Outcome
from .._invocation import Invocation
from .._wire import describe
from ._options import Inbox
from ._run import DatabaseDown, duplicate, guard_key, log, set_db

if TYPE_CHECKING:
    from .._sync.consumer import Consumer


class _Duplicate(Exception):
    pass


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
        self._probe: threading.Thread | None = None
        self._retention: threading.Thread | None = None
        self._down_lock = threading.Lock()

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> None:
        if self.inbox.retention is not None:
            self._retention = threading.Thread(
                target=self._expire_loop, name=f"ackkit-{self.name}-retention", daemon=True
            )
            self._retention.start()

    def close(self) -> None:
        self.stop.set()
        for th in (self._probe, self._retention):
            if th is not None:
                th.join(5.0)
        self.store.close()

    # -- one handler call ----------------------------------------------------------------

    def call(self, inv: Invocation) -> object:
        """Run the handler for `inv` in a transaction; None for a duplicate (acked
        without running). Raises what the handler raised (rolled back), DeadLetterMessage
        for a message without a key, DatabaseDown when the database cannot be reached."""
        ds = inv.deliveries
        d = ds[0]
        key = guard_key(self.inbox, d)
        done = 0
        while True:
            tx_ref: list[Any] = []
            try:
                return self._once(inv, key, tx_ref)
            except _Duplicate:
                with self.c.lock:
                    duplicate(self.c.core, self.name, d, key or "")
                return None
            except Exception as exc:
                fault = self.fault(exc, tx_ref[0] if tx_ref else None)
                if fault is Fault.HANDLER:
                    raise
                if fault is Fault.DOWN:
                    raise DatabaseDown(describe(exc)) from exc
                done += 1
                wait = TRANSACTION_RETRY.delay(done)
                if wait is None:
                    raise DatabaseDown(f"{done} tries failed, last: {describe(exc)}") from exc
                log.warning(
                    "%s: transient database error (try %d, again in %.2f s, not an "
                    "attempt of the message): %s",
                    self.name,
                    done,
                    wait,
                    describe(exc),
                )
                if self.c.rt.stop_event.wait(wait):
                    raise DatabaseDown("the app is stopping") from exc

    def _once(self, inv: Invocation, key: str | None, tx_ref: list[Any]) -> object:
        ds = inv.deliveries
        with self.store.transaction() as tx:
            tx_ref.append(tx.db)
            if key is not None and not tx.claim(self.name, key):
                raise _Duplicate
            set_db(ds, tx.db)
            try:
                result = inv.binding.fn(*inv.args())
            finally:
                set_db(ds, None)
            tx.check()
        return result

    # -- the database is down ---------------------------------------------------------

    def down(self, inv: Invocation, why: BaseException) -> Outcome:
        """Return `inv`'s deliveries unstarted, pause the listener, probe until the
        database answers, then resume."""
        from .._sync import flowing

        c = self.c
        ts = [d.tracked for d in inv.deliveries]
        with c.lock:
            step = c.core.flow.pause(f"inbox database down: {why}")
            if c.core.flow.active:
                more = c.core.flow.done(ts, None)
                step.returned.extend(more.returned)
            step.returned[:0] = ts
        with self._down_lock:
            if self._probe is None or not self._probe.is_alive():
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
        flowing.carry_out(c, step)
        return Outcome([])

    def _probe_loop(self) -> None:
        from .._sync import flowing

        n = 0
        while not self.stop.wait(probe_delay(n)):
            n += 1
            if self.store.ping():
                log.warning("%s: inbox database answers again: listener resumed", self.name)
                with self.c.lock:
                    step = self.c.core.flow.resume("inbox database answers again")
                if step:
                    flowing.carry_out(self.c, step)
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
