"""The inbox runner, written once for the App and the AsyncApp: the key guard and its
look-up, the transaction around a handler call (one delivery or a batch) and its retries,
the database-down pause and the probe that resumes, retention, and the outbox relay's
rounds. Each is a script (`_script`): it yields what it needs done, and a thin shell
carries that out, `_sync.SyncInbox` on threads with psycopg's Connection, `_aio.AsyncInbox`
on the event loop with its AsyncConnection. `_core.inbox` decides; nothing here waits,
locks or touches a connection itself."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from .._connection.salvage import describe
from .._core.errors import DeadLetterMessage
from .._core.inbox import (
    TRANSACTION_RETRY,
    BatchEnd,
    BatchKeys,
    DatabaseDown,
    Fault,
    KeyVerdict,
    UnusableKey,
    batch_run,
    end_batch,
    key_verdict,
    plan_batch,
    probe_delay,
    retention_batches,
)
from .._core.outcome import succeeded
from ._options import Inbox
from ._relay import RELAY_POLL
from ._script import Script, Sql
from ._sql import expire

if TYPE_CHECKING:
    from .._app.invocation import Invocation
    from .._core.listener import ListenerCore
    from .._core.step import Step
    from .._messages.delivery import DeliveryBase

log = logging.getLogger("ackkit.inbox")
T = TypeVar("T")


class Duplicate(Exception):
    """The key is recorded already (raised in the transaction, which rolls back)."""


class _Unrecorded(Exception):
    """Rolls back a look-up's transaction (`Runner.look_up`)."""


def guard_key(inbox: Inbox, d: DeliveryBase) -> str | None:
    """The delivery's key (None: run unguarded); DeadLetterMessage when it has none to use."""
    try:
        key = inbox.key_of(d)
    except Exception as exc:
        raise DeadLetterMessage(key_refused(exc)) from None
    verdict, why = key_verdict(key, inbox.missing_key)
    if verdict is KeyVerdict.DEAD_LETTER:
        raise DeadLetterMessage(why)
    return key if verdict is KeyVerdict.GUARDED else None


def key_refused(exc: Exception) -> str:
    """The dead-letter reason of a delivery whose key could not be had (`Inbox.key_of`
    raised `exc`)."""
    if isinstance(exc, UnusableKey):
        return str(exc)
    return f"inbox key function failed: {describe(exc)}"


def look_up_key(inbox: Inbox, d: DeliveryBase) -> str | None:
    """The key to look up before a redelivery starts (`LostRuns.look_up_first`);
    None when it has none to guard (`start` decides; the run then finds the same)."""
    try:
        return guard_key(inbox, d)
    except DeadLetterMessage:
        return None


def duplicate(core: ListenerCore, name: str, d: DeliveryBase, key: str) -> None:
    """Count and log (once, INFO) a delivery whose key was recorded already."""
    core.lost.duplicate(d._tracked, key)
    log.info(
        "%s: duplicate of message %r (inbox key %r already recorded): acked without "
        "running the handler",
        name,
        d.message_id,
        key,
    )


def set_db(ds: list[DeliveryBase], db: Any) -> None:
    for d in ds:
        d.db = db


def retry_after(name: str, fault: Fault, exc: Exception, tries: int) -> float:
    """How long to wait before the transaction's next try, after its `tries`-th failed
    with `exc` (the core's `fault` reading of it). Raises `exc` again for the handler's
    own error, DatabaseDown when the database is gone or the tries are used up; a
    transient error is logged and never counts as an attempt of the message."""
    if fault is Fault.HANDLER:
        raise exc
    if fault is Fault.DOWN:
        raise DatabaseDown(describe(exc)) from exc
    wait = TRANSACTION_RETRY.delay(tries)
    if wait is None:
        raise DatabaseDown(f"{tries} tries failed, last: {describe(exc)}") from exc
    log.warning(
        "%s: transient database error (try %d, again in %.2f s, not an attempt of the message): %s",
        name,
        tries,
        wait,
        describe(exc),
    )
    return wait


# -- batch listeners ----------------------------------------------------------------------


class BatchTry:
    """One batch's transaction as it goes (`_core.inbox.plan_batch` and what follows):
    the keys found recorded, the deliveries the handler gets, the end decided."""

    __slots__ = ("end", "plan", "recorded", "run")

    def __init__(self, inbox: Inbox, ds: list[DeliveryBase]) -> None:
        keys: list[str | None] = []
        refused: dict[int, str] = {}
        for i, d in enumerate(ds):
            try:
                keys.append(inbox.key_of(d))
            except Exception as exc:
                keys.append(None)
                refused[i] = key_refused(exc)
        self.plan: BatchKeys = plan_batch(keys, inbox.missing_key, refused)
        self.begin()
        self.end: BatchEnd | None = None

    def begin(self) -> None:
        """A new try of the transaction: nothing claimed yet."""
        self.recorded: list[int] = []
        self.run = batch_run(self.plan, ())

    @property
    def claims(self) -> list[str]:
        """The keys to claim, in the order to claim them."""
        return [k for _, k in self.plan.claims]

    def claimed(self, new: set[str]) -> tuple[int, ...]:
        """The claims are made (`new`: the keys newly recorded; the others were recorded
        already: duplicates): the handler's list."""
        recorded = [i for i, k in self.plan.claims if k not in new]
        self.recorded = recorded
        self.run = batch_run(self.plan, recorded)
        return self.run

    def returned(self, done: int) -> BatchEnd:
        self.end = end_batch(self.plan, self.recorded, self.run, done)
        return self.end

    def apart(self, core: ListenerCore, name: str, inv: Invocation) -> Step:
        """Settle the duplicates apart (acked, counted, logged); leave `inv` with what the
        listener's rules settle (the dead-lettered as failures of their own). The
        transaction has ended: committed (`returned`) or rolled back (the handler raised)."""
        end = self.end or end_batch(self.plan, self.recorded, self.run, None)
        ds = inv.deliveries
        for i in end.duplicates:
            duplicate(core, name, ds[i], self.plan.keys[i] or "")
        acts = core.finish_all([ds[i]._tracked for i in end.duplicates])
        dead = [(ds[i], DeadLetterMessage(why)) for i, why in self.plan.dead]
        inv.narrow(end.settled, dead)
        return acts


# -- what the runner's scripts ask of a shell ---------------------------------------------


@dataclass(frozen=True, slots=True)
class InTx:
    """Open a transaction of the store, run the script `body(tx)` in it (driven like the
    one asking), commit; the answer: what `body` returned. An error rolls back and is
    raised at the `yield`."""

    body: Callable[[Any], Script[Any]]


@dataclass(frozen=True, slots=True)
class OnTx:
    """A key operation of the open transaction `tx` for this listener: `claim` (key ->
    newly recorded?), `claim_all` (keys -> the newly recorded), `unclaim` (keys). On the
    event loop: the store's `aclaim`, `aclaim_all`, `aunclaim`."""

    tx: Any
    op: Literal["claim", "claim_all", "unclaim"]
    arg: Any


@dataclass(frozen=True, slots=True)
class Handler:
    """Call `fn(*args)` (await it, on the event loop) as the handler running in `tx`
    (its `Delivery.publish` writes to the outbox there); the answer: (its result,
    whether it wrote to the outbox)."""

    tx: Any
    fn: Callable[..., Any]
    args: tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class Wait:
    """Sleep `seconds`; the answer: True when the shell is stopping (then at once). A
    handler call's retry waits on the app's stop; `background` work (probe, retention)
    on the inbox's."""

    seconds: float
    background: bool = False


@dataclass(frozen=True, slots=True)
class Decide:
    """Have the listener carry out `fn`'s decision (`_host`: `decide`)."""

    fn: Callable[[ListenerCore], Step | None]


class Stopping:
    """Should background work end now? (True / False)"""


class Nap:
    """The relay waits `seconds` for the next round, or less if a commit wrote to the
    outbox meanwhile."""

    __slots__ = ("seconds",)

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds


class Connect:
    """The relay's database connection (autocommit, the tables made if it should)."""


@dataclass(frozen=True, slots=True)
class Round:
    """One relay round on `conn` (`relay_once` / `arelay_once` with the host's publish);
    raises what it raised."""

    conn: Any


@dataclass(frozen=True, slots=True)
class Close:
    """Close the relay's connection `conn`."""

    conn: Any


STOPPING = Stopping()
CONNECT = Connect()


class Runner:
    """One listener's inbox rules, for either shell: what `call`, `look_up`, `down`,
    `probe`, `expire_now`, `retention` and `relay` do, as scripts, and the state they
    share (the pause the database caused, the probe on its way)."""

    def __init__(
        self,
        inbox: Inbox,
        name: str,
        fault: Callable[[BaseException, Any], Fault],
        kick: Callable[[], None],
        passes: tuple[type[BaseException], ...] = (),
    ) -> None:
        self.inbox = inbox
        self.name = name
        self.fault = fault
        self.kick = kick
        """Wakes the relay (a commit wrote to the outbox: it sends now, not at its poll)."""
        self.passes: tuple[type[BaseException], ...] = (DatabaseDown, *passes)
        """What leaves a batch's deliveries whole: DatabaseDown (all returned unstarted),
        and on the event loop a cancel (released as they came)."""
        self.paused_by_db = False
        """The listener was consuming when the database went down: resume it when it answers."""
        self.probing = False
        """A probe is on its way to resume the listener (decided under the listener's
        lock): a down() meanwhile needs none of its own; once it resumed, a down() starts
        one. Not `the probe is alive`: a probe that resumed already, and is only
        finishing, would leave a down() after its resume paused with no probe, its
        deliveries held for ever."""

    # -- one handler call ----------------------------------------------------------------

    def call(self, inv: Invocation) -> Script[object]:
        """Run the handler for `inv` in a transaction; None for a duplicate (acked
        without running). Raises what the handler raised (rolled back), DeadLetterMessage
        for a message without a key, DatabaseDown when the database cannot be reached."""
        if inv.binding.batch:
            return (yield from self._call_batch(inv))
        d = inv.deliveries[0]
        key = guard_key(self.inbox, d)
        try:
            return (yield from self._retrying(lambda tx_ref: self._once(inv, key, tx_ref)))
        except Duplicate:
            yield Decide(lambda core: duplicate(core, self.name, d, key or ""))
            return None

    def _once(self, inv: Invocation, key: str | None, tx_ref: list[Any]) -> Script[object]:
        result, wrote = yield InTx(lambda tx: self._run_once(inv, key, tx, tx_ref))
        if wrote:
            self.kick()  # committed: the relay sends now, not at its next poll
        return result

    def _run_once(
        self, inv: Invocation, key: str | None, tx: Any, tx_ref: list[Any]
    ) -> Script[tuple[object, bool]]:
        tx_ref.append(tx.db)
        if key is not None and not (yield OnTx(tx, "claim", key)):
            raise Duplicate
        ds = inv.deliveries
        set_db(ds, tx.db)
        try:
            out = yield Handler(tx, inv.binding.fn, inv.args())
        finally:
            set_db(ds, None)
        tx.check()
        return out  # type: ignore[no-any-return]

    def _call_batch(self, inv: Invocation) -> Script[object]:
        """A batch in one transaction (`_core.inbox.end_batch` has the rules). Leaves
        `inv` with the deliveries the listener's rules settle; the duplicates are settled
        here. DatabaseDown leaves `inv` whole (all returned unstarted)."""
        b = BatchTry(self.inbox, list(inv.deliveries))
        try:
            result = yield from self._retrying(lambda tx_ref: self._once_batch(inv, b, tx_ref))
        except self.passes:
            raise
        except BaseException:
            yield Decide(lambda core: b.apart(core, self.name, inv))  # rolled back: only
            raise  # the recorded keys are duplicates
        yield Decide(lambda core: b.apart(core, self.name, inv))
        return result

    def _once_batch(self, inv: Invocation, b: BatchTry, tx_ref: list[Any]) -> Script[object]:
        b.begin()
        result, wrote = yield InTx(lambda tx: self._run_batch(inv, b, tx, tx_ref))
        if wrote:
            self.kick()
        return result

    def _run_batch(
        self, inv: Invocation, b: BatchTry, tx: Any, tx_ref: list[Any]
    ) -> Script[tuple[object, bool]]:
        tx_ref.append(tx.db)
        run = b.claimed((yield OnTx(tx, "claim_all", b.claims)) if b.claims else set())
        result: object = None
        wrote = False
        if run:
            ds = [inv.deliveries[i] for i in run]
            set_db(ds, tx.db)
            try:
                result, wrote = yield Handler(tx, inv.binding.fn, inv.args_of(run))
            finally:
                set_db(ds, None)
            tx.check()
        end = b.returned(succeeded(result, len(run), True))
        if end.unrecord:
            yield OnTx(tx, "unclaim", end.unrecord)
        return result, wrote

    def look_up(self, d: DeliveryBase) -> Script[str | DatabaseDown | None]:
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
            yield from self._retrying(lambda tx_ref: self._look_up(key, tx_ref))
        except Duplicate:
            return key
        except DatabaseDown as e:
            return e
        except Exception as e:  # a broken inbox table: the run will meet it too
            log.warning("%s: inbox look-up failed: %s", self.name, describe(e))
        return None

    def _look_up(self, key: str, tx_ref: list[Any]) -> Script[None]:
        with contextlib.suppress(_Unrecorded):
            yield InTx(lambda tx: self._claim_back(key, tx, tx_ref))

    def _claim_back(self, key: str, tx: Any, tx_ref: list[Any]) -> Script[None]:
        tx_ref.append(tx.db)
        if not (yield OnTx(tx, "claim", key)):
            raise Duplicate
        raise _Unrecorded  # rolls the claim back: a look-up records nothing

    def _retrying(self, once: Callable[[list[Any]], Script[T]]) -> Script[T]:
        """`once(tx_ref)` (it opens a transaction), tried again after a transient error."""
        done = 0
        while True:
            tx_ref: list[Any] = []
            try:
                return (yield from once(tx_ref))
            except Duplicate:
                raise
            except Exception as exc:
                done += 1
                fault = self.fault(exc, tx_ref[0] if tx_ref else None)
                wait = retry_after(self.name, fault, exc, done)  # or raises
                if (yield Wait(wait)):
                    raise DatabaseDown("the app is stopping") from exc

    # -- the database is down ---------------------------------------------------------

    def down(self, inv: Invocation, why: BaseException) -> Script[bool]:
        """Return `inv`'s deliveries unstarted and pause the listener; True when the
        shell is to start a probe (`probe`), which resumes it when the database answers."""
        ts = [d._tracked for d in inv.deliveries]
        probe = [False]

        def pause(core: ListenerCore) -> Step:
            if not core.gating.flow.paused:  # paused by hand before: left to the hand
                self.paused_by_db = True
            acts = core.gating.set_paused(True, f"inbox database down: {why}", returning=ts)
            # decided with the pause, under the lock the probe resumes under
            probe[0], self.probing = not self.probing, True
            return acts

        yield Decide(pause)
        if probe[0]:
            log.error(
                "%s: inbox database unreachable (%s): listener paused, deliveries "
                "returned unstarted (not attempts); probing until it answers",
                self.name,
                why,
            )
        return probe[0]

    def probe(self) -> Script[None]:
        """Ping the database, less and less often, until it answers; then resume the
        listener (when the database paused it)."""
        n = 0
        while not (yield Wait(probe_delay(n), background=True)):
            n += 1
            if (yield from self.ping()):
                log.warning("%s: inbox database answers again: listener resumed", self.name)
                yield Decide(self._resume)
                return

    def _resume(self, core: ListenerCore) -> Step | None:
        self.probing = False  # a down() from now on starts a probe of its own
        mine, self.paused_by_db = self.paused_by_db, False
        return core.gating.set_paused(False, "inbox database answers again") if mine else None

    def ping(self) -> Script[bool]:
        """Does the store answer (a transaction that runs SELECT 1)?"""
        try:
            yield InTx(_select_one)
        except Exception:
            return False
        return True

    # -- retention ------------------------------------------------------------------------

    def retention(self) -> Script[None]:
        """Every `retention_interval` seconds, `expire_now`, until stopped."""
        while not (yield Wait(self.inbox.retention_interval, background=True)):
            yield from self.expire_now()

    def expire_now(self) -> Script[int]:
        """Delete expired keys in batches until a batch comes back short; how many."""
        total = 0
        batch = self.inbox.retention_batch
        older = float(self.inbox.retention or 0)
        while not (yield STOPPING):
            try:
                if self.inbox.in_memory:
                    from ._memory import memory_inbox

                    n = memory_inbox(self.inbox.dsn).expire(older, batch)
                else:
                    n = yield InTx(lambda tx: self._expire(tx, older, batch))
            except Exception as exc:
                log.warning("%s: inbox retention failed: %s", self.name, describe(exc))
                return total
            total += n
            if not retention_batches(n, batch):
                return total
        return total

    def _expire(self, tx: Any, older: float, batch: int) -> Script[int]:
        return int((yield Sql(tx.db, expire(self.inbox.table), (older, batch), "count")))

    # -- the outbox relay -----------------------------------------------------------------

    def relay(self) -> Script[None]:
        """Relay rounds until stopped: one after each commit that wrote to the outbox or
        `RELAY_POLL` seconds; after a failure (logged, the rows kept) a new connection,
        with the probe's backoff. When it stops, what is left waits for the next app."""
        conn: Any = None
        fails = 0
        try:
            while not (yield STOPPING):
                yield Nap(RELAY_POLL if not fails else probe_delay(fails))
                if (yield STOPPING):
                    break
                try:
                    if conn is None or conn.closed or conn.broken:
                        conn = yield CONNECT
                    yield Round(conn)
                    fails = 0
                except Exception as exc:
                    fails += 1
                    log.warning(
                        "%s: outbox relay: %s (rows kept, sent later)", self.name, describe(exc)
                    )
        finally:
            if conn is not None:
                yield Close(conn)


def _select_one(tx: Any) -> Script[None]:
    if tx.db is not None:  # the in-memory store has no database: it always answers
        yield Sql(tx.db, "SELECT 1")
