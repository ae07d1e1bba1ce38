"""What the App and AsyncApp runners share: the key decision before a transaction, the
duplicate's count and log line, and the error that returns a delivery unstarted."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

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
)
from ._options import Inbox

if TYPE_CHECKING:
    from .._app.invocation import Invocation
    from .._core.listener import ListenerCore
    from .._core.step import Step
    from .._messages.delivery import DeliveryBase

log = logging.getLogger("ackkit.inbox")


class Duplicate(Exception):
    """The key is recorded already (raised in the transaction, which rolls back)."""


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
