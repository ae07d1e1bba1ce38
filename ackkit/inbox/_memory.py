"""The in-memory inbox (``Inbox("memory://<name>")``): the same dedup rules as the
PostgreSQL one, for a service's fast tests on the in-memory broker. Process-wide,
shared by name. There is no database: in a handler `delivery.db` is `NoDatabase`, false,
and any other use of it raises, naming the fix (PostgreSQL with the `postgres_dsn`
fixture).

A claimed key is held by its transaction until it commits (the key is recorded) or
rolls back (it is free again); a twin claiming it meanwhile waits, like PostgreSQL's
unique index makes a concurrent INSERT wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

from .._core.inbox import Fault
from .._messages.delivery import NO_DATABASE
from ._options import MEMORY_SCHEME, Inbox

_STORES: dict[str, MemoryInbox] = {}
_STORES_LOCK = threading.Lock()


class MemoryInbox:
    """The keys of one ``memory://<name>`` inbox: (listener, key) -> time recorded."""

    def __init__(self) -> None:
        self.keys: dict[tuple[str, str], float] = {}
        self.held: set[tuple[str, str]] = set()
        self.cond = threading.Condition()

    def try_claim(self, k: tuple[str, str]) -> bool | None:
        """True: claimed; False: recorded already (a duplicate); None: held by a twin."""
        with self.cond:
            if k in self.keys:
                return False
            if k in self.held:
                return None
            self.held.add(k)
            return True

    def claim(self, k: tuple[str, str]) -> bool:
        with self.cond:
            while True:
                got = self.try_claim(k)
                if got is not None:
                    return got
                self.cond.wait()

    def end(self, claimed: list[tuple[str, str]], commit: bool) -> None:
        with self.cond:
            for k in claimed:
                self.held.discard(k)
                if commit:
                    self.keys[k] = time.time()
            self.cond.notify_all()

    def expire(self, older_than: float, limit: int) -> int:
        """Delete at most `limit` keys recorded more than `older_than` seconds ago."""
        cut = time.time() - older_than
        with self.cond:
            old = [k for k, at in self.keys.items() if at < cut][:limit]
            for k in old:
                del self.keys[k]
        return len(old)

    def clear(self) -> None:
        with self.cond:
            self.keys.clear()


def memory_inbox(name_or_dsn: str) -> MemoryInbox:
    """The in-memory inbox named `name` (``memory://name`` also accepted), made on first use."""
    name = name_or_dsn.removeprefix(MEMORY_SCHEME)
    with _STORES_LOCK:
        store = _STORES.get(name)
        if store is None:
            store = _STORES[name] = MemoryInbox()
        return store


class MemoryTx:
    __slots__ = ("claimed", "db", "store")

    def __init__(self, store: MemoryInbox) -> None:
        self.store = store
        self.db = None
        self.claimed: list[tuple[str, str]] = []

    def claim(self, listener: str, key: str) -> bool:
        got = self.store.claim((listener, key))
        if got:
            self.claimed.append((listener, key))
        return got

    async def aclaim(self, listener: str, key: str) -> bool:
        while True:
            got = self.store.try_claim((listener, key))
            if got is not None:
                if got:
                    self.claimed.append((listener, key))
                return got
            await asyncio.sleep(0.005)

    def claim_all(self, listener: str, keys: list[str]) -> set[str]:
        return {k for k in keys if self.claim(listener, k)}

    async def aclaim_all(self, listener: str, keys: list[str]) -> set[str]:
        return {k for k in keys if await self.aclaim(listener, k)}

    def unclaim(self, listener: str, keys: tuple[str, ...]) -> None:
        """Release keys claimed in this transaction: not recorded at its commit."""
        gone = [(listener, k) for k in keys]
        self.claimed = [k for k in self.claimed if k not in set(gone)]
        self.store.end(gone, commit=False)

    async def aunclaim(self, listener: str, keys: tuple[str, ...]) -> None:
        self.unclaim(listener, keys)

    def check(self) -> None:
        pass


class NoDatabaseError(RuntimeError):
    """A handler used `delivery.db` on the in-memory inbox, which has no database."""


class NoDatabase:
    """`delivery.db` in a handler of a ``memory://`` inbox: false (``if delivery.db:``
    skips the database work), and any other use raises :class:`NoDatabaseError` naming
    the fix, where None made the handler fail with "'NoneType' object has no attribute
    'execute'"."""

    __slots__ = ("dsn",)

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn

    def _refuse(self, what: str) -> NoDatabaseError:
        return NoDatabaseError(
            f"delivery.db.{what}: this listener's inbox is Inbox({self.dsn!r}), the in-memory "
            "inbox, which has no database for the handler to write in. Test a handler that "
            "uses delivery.db on PostgreSQL: Inbox(postgres_dsn) with the test kit's "
            "postgres_dsn fixture (a fresh database per test, about 1 s; the in-memory "
            "broker stays), see docs/guide/testing.md. Keep memory:// for handlers that "
            "do not use delivery.db (`if delivery.db:` is False here)."
        )

    def __getattr__(self, name: str) -> Any:
        raise self._refuse(name)

    def __enter__(self) -> Any:
        raise self._refuse("__enter__")

    async def __aenter__(self) -> Any:
        raise self._refuse("__aenter__")

    def __exit__(self, *exc: object) -> None:
        pass

    async def __aexit__(self, *exc: object) -> None:
        pass

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return f"<no database: Inbox({self.dsn!r}) is in memory>"


class MemoryStore:
    """The runners' view of an in-memory inbox (the sync and the asyncio one)."""

    def __init__(self, inbox: Inbox) -> None:
        self.inbox = inbox
        self.store = memory_inbox(inbox.dsn)

    @contextlib.contextmanager
    def transaction(self) -> Iterator[MemoryTx]:
        tx = MemoryTx(self.store)
        ok = False
        # tx.db stays None (the runners read it: no outbox, publish at once); the
        # handler's delivery.db reads this stand-in
        standin = NO_DATABASE.set(NoDatabase(self.inbox.dsn))
        try:
            yield tx
            ok = True
        finally:
            NO_DATABASE.reset(standin)
            self.store.end(tx.claimed, ok)

    @contextlib.asynccontextmanager
    async def atransaction(self) -> AsyncIterator[MemoryTx]:
        with self.transaction() as tx:
            yield tx

    def close(self) -> None:
        pass


def memory_fault(exc: BaseException, conn: object = None) -> Fault:
    return Fault.HANDLER
