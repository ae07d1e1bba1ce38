"""What the App and AsyncApp runners share: the key decision before a transaction, the
duplicate's count and log line, and the error that returns a delivery unstarted."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from .._core.errors import DeadLetterMessage
from .._core.inbox import TRANSACTION_RETRY, Fault, KeyVerdict, key_verdict
from .._wire import describe
from ._options import Inbox

if TYPE_CHECKING:
    from .._core.listener import ListenerCore
    from .._delivery import DeliveryBase

log = logging.getLogger("ackkit.inbox")


class DatabaseDown(Exception):
    """The inbox's database cannot be reached: the runtime returns the deliveries
    unstarted (not an attempt) and pauses the listener until it answers."""


class Duplicate(Exception):
    """The key is recorded already (raised in the transaction, which rolls back)."""


def guard_key(inbox: Inbox, d: DeliveryBase) -> str | None:
    """The delivery's key (None: run unguarded); DeadLetterMessage when it has none to use."""
    try:
        key = inbox.key_of(d)
    except Exception as exc:
        raise DeadLetterMessage(f"inbox key function failed: {describe(exc)}") from None
    verdict, why = key_verdict(key, inbox.missing_key)
    if verdict is KeyVerdict.DEAD_LETTER:
        raise DeadLetterMessage(why)
    return key if verdict is KeyVerdict.GUARDED else None


def look_up_key(inbox: Inbox, d: DeliveryBase) -> str | None:
    """The key to look up before a redelivery starts (`ListenerCore.look_up_first`);
    None when it has none to guard (`start` decides; the run then finds the same)."""
    try:
        return guard_key(inbox, d)
    except DeadLetterMessage:
        return None


def duplicate(core: ListenerCore, name: str, d: DeliveryBase, key: str) -> None:
    """Count and log (once, INFO) a delivery whose key was recorded already."""
    core.duplicate(d._tracked, key)
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
