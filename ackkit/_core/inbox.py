"""The inbox's decisions, without I/O: what a delivery's dedup key comes to, what a
database error means for the message, and how long to wait before trying again.

The I/O (psycopg, or the in-memory store) lives in `ackkit._inbox`; it asks here and
carries out the answer:

- `key_verdict`: run the handler guarded by the key, run it unguarded (an explicit
  option), or dead-letter the message (no usable key: never silently run twice);
- `fault_of`: a database error is the handler's own failure (the usual retry and
  dead-letter rules), transient (retry the whole transaction in process, not counted as
  an attempt), or a sign the database is down (return the delivery unstarted and pause
  the listener until it answers again);
- `Backoff`: the waits of in-process transaction retries and of the probes while down;
- `plan_batch`, `batch_run`, `end_batch`: a batch listener's one transaction per batch
  (which deliveries the handler gets, which are duplicates, which keys are recorded).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum

from . import checks as C

MAX_KEY_LENGTH = 512
"""The longest dedup key, in characters (the inbox table's primary key holds it)."""


class MissingKey(str, Enum):
    """What an inbox listener does with a message that has no dedup key."""

    DEAD_LETTER = "dead_letter"
    """Dead-letter it with the reason "no inbox key" (the default): a message that
    cannot be deduplicated is never run, so it is never run twice."""
    RUN = "run"
    """Run it without dedup (inside the transaction all the same): a redelivery runs it
    again. Only by this explicit option."""


class KeyVerdict(str, Enum):
    """What a delivery's key comes to, before the transaction starts."""

    GUARDED = "guarded"
    """Record the key in the transaction; a key already recorded is a duplicate."""
    UNGUARDED = "unguarded"
    """No key, and `MissingKey.RUN`: run the handler in the transaction, no record."""
    DEAD_LETTER = "dead_letter"
    """No usable key: dead-letter the message without running the handler."""


BYTES_MARK = "\ufffe"
"""The first character of a key given as bytes that are not NUL-free UTF-8: the key is
stored as this mark and the bytes in hex. No text key starts with it (one that does is
refused), so a key given as bytes never meets a key given as text."""

MAX_KEY_BYTES = (MAX_KEY_LENGTH - len(BYTES_MARK)) // 2
"""The longest key given as bytes that are not UTF-8 (stored in hex, two characters a byte)."""


class UnusableKey(ValueError):
    """A key that cannot be stored as given (the message is dead-lettered with this text
    as its reason, without running the handler)."""


def normalize_key(value: object) -> str | None:
    """The key as stored (None: no key). Never lossy: two different keys are never
    stored alike, and the same key always is.

    - text is stored as it is; text with a NUL character (PostgreSQL text cannot hold
      one), text that is not Unicode (a lone surrogate), text starting with
      `BYTES_MARK`, or over `MAX_KEY_LENGTH` characters raises UnusableKey;
    - bytes (also bytearray, memoryview: aio-pika hands a byte-array header over as a
      bytearray) that are UTF-8 without NUL are the same key as that text (one id is
      one key, whichever client's type carries it); other bytes are stored as
      `BYTES_MARK` and their hex, at most `MAX_KEY_BYTES` of them;
    - an int is its decimal text; None, "" and b"" are no key;
    - anything else (a bool, a float, a table, an array) raises TypeError.
    """
    if value is None:
        return None
    if isinstance(value, (bytes, bytearray, memoryview)):
        raw = bytes(value)
        if not raw:
            return None
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            text = None
        if text is not None and "\x00" not in text and not text.startswith(BYTES_MARK):
            return _checked_text(text)
        if len(raw) > MAX_KEY_BYTES:
            raise UnusableKey(
                f"inbox key of {len(raw)} bytes (not UTF-8 text) is longer than "
                f"{MAX_KEY_BYTES} bytes"
            )
        return BYTES_MARK + raw.hex()
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise TypeError(f"an inbox key must be text, bytes or an int, got {type(value).__name__}")
    text = str(value)
    return _checked_text(text) if text else None


def _checked_text(text: str) -> str:
    if len(text) > MAX_KEY_LENGTH:
        raise UnusableKey(f"inbox key of {len(text)} characters is longer than {MAX_KEY_LENGTH}")
    if "\x00" in text:
        raise UnusableKey(
            "inbox key contains a NUL character, which a PostgreSQL text key cannot hold "
            "(give the key as bytes to keep it whole)"
        )
    if text.startswith(BYTES_MARK):
        raise UnusableKey(
            "inbox key starts with U+FFFE, which ackkit reserves for keys given as bytes"
        )
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise UnusableKey(
            "inbox key is not Unicode text (it holds a lone surrogate); give it as bytes"
        ) from None
    return text


def key_verdict(key: str | None, missing: MissingKey) -> tuple[KeyVerdict, str]:
    """What to do with a delivery whose stored key (`normalize_key`) is `key`; the reason,
    when dead-lettered."""
    if key is None:
        if missing is MissingKey.RUN:
            return KeyVerdict.UNGUARDED, ""
        return KeyVerdict.DEAD_LETTER, (
            "no inbox key: the message has no message_id (or the listener's key function "
            "gave none), so it cannot be deduplicated; publish it with a message_id, or "
            "use Inbox(missing_key=MissingKey.RUN) to run such messages without dedup"
        )
    if len(key) > MAX_KEY_LENGTH:
        return KeyVerdict.DEAD_LETTER, (
            f"inbox key of {len(key)} characters is longer than {MAX_KEY_LENGTH}"
        )
    return KeyVerdict.GUARDED, ""


class DatabaseDown(Exception):
    """The inbox's database cannot be reached: the deliveries go back unstarted (not an
    attempt) and the listener pauses until it answers."""


class Fault(str, Enum):
    """What a database error means for the message being handled."""

    HANDLER = "handler"
    """The handler's own failure (a constraint it broke, bad SQL): retry or dead-letter
    by the listener's rules, as for any exception."""
    TRANSIENT = "transient"
    """Serialization failure, deadlock, lock timeout, a lost connection: roll back and run
    the transaction again in process; not an attempt of the message."""
    DOWN = "down"
    """The database cannot be reached: return the delivery unstarted (not an attempt)
    and pause the listener until the database answers."""


TRANSIENT_STATES = frozenset(
    {
        "40001",  # serialization_failure
        "40P01",  # deadlock_detected
        "55P03",  # lock_not_available
        "57014",  # query_canceled (statement_timeout)
        "25P03",  # idle_in_transaction_session_timeout
    }
)
DOWN_STATES = frozenset(
    {
        "57P01",  # admin_shutdown
        "57P02",  # crash_shutdown
        "57P03",  # cannot_connect_now (starting up, shutting down, in recovery)
        "53300",  # too_many_connections
        "53400",  # configuration_limit_exceeded
    }
)

MISSING_TABLE_STATES = frozenset({"42P01", "3F000"})  # undefined_table, invalid_schema_name
"""A table is not there. When it is one of the inbox's own tables (looked up after the
error), the database counts as DOWN until it exists: an environment fault, never the
message's; a table the handler's own SQL names is the handler's failure."""


def fault_of(sqlstate: str | None, *, connection_lost: bool, connecting: bool) -> Fault:
    """Classify a database error.

    `sqlstate`: its SQLSTATE (None when the client raised before the server answered);
    `connection_lost`: the connection is closed or broken after it; `connecting`: it
    was raised while opening a connection. A failure to connect, or a server shutting
    down, is DOWN; a lost connection mid-transaction (the commit's fate unknown) is
    TRANSIENT: the retry finds the key recorded if the commit did go through.
    """
    if connecting:
        return Fault.DOWN
    if sqlstate is not None:
        if sqlstate in TRANSIENT_STATES:
            return Fault.TRANSIENT
        if sqlstate in DOWN_STATES or sqlstate.startswith("08"):
            return Fault.TRANSIENT if connection_lost else Fault.DOWN
    if connection_lost:
        return Fault.TRANSIENT
    return Fault.HANDLER


@dataclass(frozen=True, slots=True)
class Backoff:
    """Exponential waits: `first`, doubling, at most `cap` seconds; `tries` in all
    (then the caller gives up: a transaction that keeps failing transiently is treated
    as the database being down)."""

    first: float = 0.05
    cap: float = 2.0
    tries: int = 6

    def __post_init__(self) -> None:
        object.__setattr__(self, "first", C.number("Backoff.first", self.first, 0, 3600))
        object.__setattr__(self, "cap", C.number("Backoff.cap", self.cap, 0, 3600))
        C.integer("Backoff.tries", self.tries, 1, 1000)

    def delay(self, done: int) -> float | None:
        """The wait before try `done + 1`, after `done` failed tries; None: give up."""
        if done >= self.tries:
            return None
        if done <= 0:
            return 0.0
        return min(self.cap, self.first * 2.0 ** min(done - 1, 60))


TRANSACTION_RETRY = Backoff()
"""In-process retries of a transaction that failed transiently."""
PROBE = Backoff(first=0.5, cap=5.0, tries=1_000)
"""Waits between probes of a database that is down (the listener paused meanwhile)."""


def probe_delay(done: int) -> float:
    """Seconds before the next probe of a database that is down, after `done` probes."""
    d = PROBE.delay(min(done, PROBE.tries - 1))
    return PROBE.cap if d is None else max(d, PROBE.first)


def retention_batches(deleted: int, batch: int) -> bool:
    """Another retention batch right away? (The last one was full: more rows are due.)"""
    return deleted >= batch


# -- batch listeners: one transaction per batch -------------------------------------------


@dataclass(frozen=True, slots=True)
class BatchKeys:
    """An inbox batch's keys sorted out before its transaction (`plan_batch`); indexes
    are positions in the batch as the listener took it."""

    keys: tuple[str | None, ...]
    """Each delivery's key (None: none to guard)."""
    dead: tuple[tuple[int, str], ...]
    """Dead-lettered unrun, with the reason (no usable key): left out of the handler's list."""
    claims: tuple[tuple[int, str], ...]
    """Keys to record in the transaction, sorted by key (two batches claiming overlapping
    keys take them in one order, never deadlocking); one per key: its first delivery."""
    twins: tuple[tuple[int, int], ...]
    """(index, index of the earlier delivery with the same key): left out of the
    handler's list, its fate follows the earlier one's."""
    unguarded: tuple[int, ...]
    """No key and `MissingKey.RUN`: run, never recorded."""


def plan_batch(
    keys: Sequence[str | None], missing: MissingKey, refused: Mapping[int, str] | None = None
) -> BatchKeys:
    """Sort a batch's keys out: `keys[i]` is delivery i's key, `refused[i]` the reason its
    key function failed (then it is dead-lettered)."""
    refused = refused or {}
    dead: list[tuple[int, str]] = []
    claims: list[tuple[int, str]] = []
    twins: list[tuple[int, int]] = []
    unguarded: list[int] = []
    first: dict[str, int] = {}
    kept: list[str | None] = []
    for i, key in enumerate(keys):
        if i in refused:
            dead.append((i, refused[i]))
            kept.append(None)
            continue
        verdict, why = key_verdict(key, missing)
        if verdict is KeyVerdict.DEAD_LETTER:
            dead.append((i, why))
            kept.append(None)
        elif verdict is KeyVerdict.UNGUARDED:
            unguarded.append(i)
            kept.append(None)
        else:
            assert key is not None
            kept.append(key)
            if key in first:
                twins.append((i, first[key]))
            else:
                first[key] = i
                claims.append((i, key))
    claims.sort(key=lambda c: c[1])
    return BatchKeys(tuple(kept), tuple(dead), tuple(claims), tuple(twins), tuple(unguarded))


def batch_run(plan: BatchKeys, recorded: Collection[int]) -> tuple[int, ...]:
    """The deliveries the handler gets, in batch order, once the claims are made:
    `recorded` are those whose claim found the key recorded already (duplicates). Left
    out: the dead-lettered, the duplicates, the twins."""
    out = {i for i, _ in plan.claims if i not in recorded}
    out.update(plan.unguarded)
    return tuple(sorted(out))


@dataclass(frozen=True, slots=True)
class BatchEnd:
    """What a batch's transaction comes to (`end_batch`)."""

    unrecord: tuple[str, ...]
    """Keys claimed in the transaction to remove again before it commits (the failed
    tail of an AckIndex): they stay "not done"."""
    duplicates: tuple[int, ...]
    """Acked as duplicates, without the handler: keys recorded already, and twins of
    deliveries whose key this transaction records."""
    settled: tuple[int, ...]
    """The deliveries the listener's usual rules settle, in order: the handler's list
    (its first `done` succeeded), then the twins of those that failed (failed too)."""


def end_batch(
    plan: BatchKeys, recorded: Collection[int], run: Sequence[int], done: int | None
) -> BatchEnd:
    """The fates of a batch whose handler got `run` (`batch_run`) and then returned with
    `done` of them succeeded (`outcome.succeeded`: all of them, or AckIndex(i): i+1), or
    raised (`done` None: the transaction rolls back, nothing is recorded).

    - a delivery whose key was recorded already is a duplicate, whatever the handler did;
    - with AckIndex(i) the transaction commits (the handler's writes are its own: for
      the failed tail too) and records the keys of run[0..i] only;
    - a twin is a duplicate of its earlier delivery when that one's key is recorded by
      this commit (or was already); else it fails with it (retried, dead-lettered).
    """
    ok: set[int] = set(run[: done or 0]) if done is not None else set()
    failed = [i for i in run if i not in ok]
    recorded_now = {i for i, _ in plan.claims if i in ok}
    unrecord = (
        tuple(sorted(plan.keys[i] or "" for i in failed if plan.keys[i] is not None))
        if done is not None
        else ()
    )
    dups = list(recorded)
    failing_twins: list[int] = []
    for i, earlier in plan.twins:
        if earlier in recorded or earlier in recorded_now:
            dups.append(i)
        else:
            failing_twins.append(i)
    return BatchEnd(unrecord, tuple(sorted(dups)), tuple(run) + tuple(failing_twins))
