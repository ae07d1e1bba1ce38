"""`Inbox`: the listener option that runs a handler in a PostgreSQL transaction that also
records the message's dedup key. A value, checked at once; no I/O here."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .._connection.url import mask_url
from .._core import checks as C
from .._core.inbox import MissingKey, normalize_key

if TYPE_CHECKING:
    from .._messages.delivery import DeliveryBase

DAY = 86_400.0
DEFAULT_RETENTION = 7 * DAY
MEMORY_SCHEME = "memory://"
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}(\.[A-Za-z_][A-Za-z0-9_]{0,62})?$")

# Any: a key function may be typed for Delivery or AsyncDelivery (it reads only the
# read-only parts both have).
KeyFunction = Callable[[Any], object]
"""A delivery's dedup key: text, bytes (or bytearray) or an int; None or "" for none."""


def _table(option: str, value: object) -> str:
    name = C.text(option, value)
    if not _IDENT.match(name):
        raise ValueError(
            f"{option} must be a table name (letters, digits, _; optionally schema.table), "
            f"got {value!r}"
        )
    return name


@dataclass(frozen=True)
class Inbox:
    """Exactly-once database effects for one listener: `listener(..., inbox=Inbox(dsn))`.

    The handler runs inside a PostgreSQL transaction (psycopg 3) that also inserts the
    message's key into the inbox table; the transaction commits, and only then is the
    message acked. A redelivery whose key is already committed is acked without running
    the handler (counted as `duplicate`). The handler does its writes on `delivery.db`,
    the transaction's connection (a `psycopg.Connection` on App, an
    `psycopg.AsyncConnection` on AsyncApp); it must not commit or roll back itself.
    A batch listener runs one transaction per batch: duplicates are left out of its
    list, and with `AckIndex(i)` only the keys of [0..i] are recorded (the commit
    includes the handler's writes for the rest: use a savepoint per message).

    - `dsn`: a libpq connection string or URL (``postgresql://user:pw@host/db``), or
      ``memory://<name>`` for the in-memory inbox of fast tests (no server, no
      `delivery.db`; the same dedup rules).
    - `key`: a function of the Delivery giving its key (a header, a payload field);
      the message_id by default. Keys are per listener.
    - `missing_key`: a message without a key is dead-lettered with its reason
      (`MissingKey.DEAD_LETTER`, the default) or run without dedup (`MissingKey.RUN`).
    - `retention`: seconds a key is kept (7 days); older rows are deleted in the
      background in batches of `retention_batch` every `retention_interval` seconds.
      None keeps them for ever. A redelivery after the window runs again.
    - `table`, `outbox_table`: the tables' names; `create_tables`: create them (and
      their index) if missing when the app starts (else run the SQL of
      `ackkit.inbox.SCHEMA` in your own migrations).
    - `connect_timeout`: seconds to wait for a connection before the database counts as
      down (the listener pauses until it answers).
    """

    dsn: str = field(repr=False)
    key: KeyFunction | None = None
    missing_key: MissingKey = MissingKey.DEAD_LETTER
    retention: float | None = DEFAULT_RETENTION
    retention_interval: float = 60.0
    retention_batch: int = 1000
    table: str = "ackkit_inbox"
    outbox_table: str = "ackkit_outbox"
    create_tables: bool = True
    connect_timeout: float = 5.0

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        dsn = C.text("Inbox.dsn", self.dsn)
        if dsn.startswith(MEMORY_SCHEME) and not dsn[len(MEMORY_SCHEME) :]:
            raise ValueError("Inbox.dsn 'memory://' needs a name: memory://<name>")
        if self.key is not None and not callable(self.key):
            raise TypeError(
                f"Inbox.key must be a function of the Delivery or None, got {self.key!r}"
            )
        set_(self, "missing_key", C.enum("Inbox.missing_key", MissingKey, self.missing_key))
        if self.retention is not None:
            set_(
                self,
                "retention",
                C.number("Inbox.retention", self.retention, 0, 3650 * DAY, above=True),
            )
        set_(
            self,
            "retention_interval",
            C.number("Inbox.retention_interval", self.retention_interval, 0, DAY, above=True),
        )
        C.integer("Inbox.retention_batch", self.retention_batch, 1, 1_000_000)
        _table("Inbox.table", self.table)
        _table("Inbox.outbox_table", self.outbox_table)
        if self.table == self.outbox_table:
            raise ValueError("Inbox.table and Inbox.outbox_table must differ")
        C.flag("Inbox.create_tables", self.create_tables)
        set_(
            self,
            "connect_timeout",
            C.number("Inbox.connect_timeout", self.connect_timeout, 0, 3600, above=True),
        )

    def __repr__(self) -> str:
        return f"Inbox({self.safe_dsn!r}, table={self.table!r})"

    @property
    def safe_dsn(self) -> str:
        """The DSN with its password masked (URL form and ``password=`` form)."""
        return re.sub(r"(password\s*=\s*)\S+", r"\1***", mask_url(self.dsn), flags=re.I)

    @property
    def in_memory(self) -> bool:
        return self.dsn.startswith(MEMORY_SCHEME)

    def key_of(self, d: DeliveryBase) -> str | None:
        """The delivery's dedup key as stored (`ackkit._core.inbox.normalize_key`; None:
        it has none). A key function that raises, or a key that cannot be stored as
        given, raises (the message is dead-lettered with that reason)."""
        raw: Any = d.message_id if self.key is None else self.key(d)
        return normalize_key(raw)
