"""The inbox's and the outbox's SQL (PostgreSQL)."""

from __future__ import annotations

SCHEMA = """\
CREATE TABLE IF NOT EXISTS {inbox} (
    listener    text        NOT NULL,
    key         text        NOT NULL,
    received_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (listener, key)
);
CREATE INDEX IF NOT EXISTS {inbox_index} ON {inbox} (received_at);
CREATE TABLE IF NOT EXISTS {outbox} (
    id          bigserial   PRIMARY KEY,
    exchange    text        NOT NULL,
    routing_key text        NOT NULL,
    body        bytea       NOT NULL,
    properties  jsonb       NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);
"""


def schema(inbox: str = "ackkit_inbox", outbox: str = "ackkit_outbox") -> str:
    """The CREATE statements for the tables (names already checked identifiers)."""
    index = inbox.rsplit(".", 1)[-1] + "_received_at"  # an index lives in its table's schema
    return SCHEMA.format(inbox=inbox, outbox=outbox, inbox_index=index)


def claim(inbox: str) -> str:
    """Record a key; no row comes back when it is there already (a concurrent twin's
    uncommitted insert makes this wait for that transaction's end)."""
    return (
        f"INSERT INTO {inbox} (listener, key) VALUES (%s, %s) "
        "ON CONFLICT (listener, key) DO NOTHING RETURNING 1"
    )


def claim_all(inbox: str) -> str:
    """Record a batch's keys (%s: the listener, %s: the keys, sorted) in one statement,
    in the array's order; the keys that were not there already come back."""
    return (
        f"INSERT INTO {inbox} (listener, key) SELECT %s, k FROM unnest(%s::text[]) "
        "WITH ORDINALITY AS u(k, o) ORDER BY o "
        "ON CONFLICT (listener, key) DO NOTHING RETURNING key"
    )


def unclaim(inbox: str) -> str:
    """Remove keys claimed in this transaction (a batch's failed tail: not done)."""
    return f"DELETE FROM {inbox} WHERE listener = %s AND key = ANY(%s)"


def expire(inbox: str) -> str:
    """Delete at most %s rows received more than %s seconds ago."""
    return (
        f"DELETE FROM {inbox} WHERE ctid = ANY(ARRAY(SELECT ctid FROM {inbox} "
        "WHERE received_at < now() - make_interval(secs => %s) LIMIT %s))"
    )


def enqueue(outbox: str) -> str:
    return f"INSERT INTO {outbox} (exchange, routing_key, body, properties) VALUES (%s, %s, %s, %s)"


def pending(outbox: str, skip: bool = False) -> str:
    """The oldest %s rows; `skip`: first %s, the exchanges whose rows are left out (held:
    they do not exist)."""
    where = "WHERE NOT exchange = ANY(%s) " if skip else ""
    return (
        f"SELECT id, exchange, routing_key, body, properties FROM {outbox} "
        f"{where}ORDER BY id LIMIT %s"
    )


def sent(outbox: str) -> str:
    return f"DELETE FROM {outbox} WHERE id = ANY(%s)"


def tables_present() -> str:
    """Which of two tables (%s, %s: names as given, optionally schema.table) exist: two
    booleans."""
    return "SELECT to_regclass(%s) IS NOT NULL, to_regclass(%s) IS NOT NULL"


SCHEMA_LOCK = "SELECT pg_advisory_xact_lock(hashtext('ackkit-inbox-schema'))"
RELAY_LOCK = "SELECT pg_try_advisory_lock(hashtext(%s))"
RELAY_UNLOCK = "SELECT pg_advisory_unlock(hashtext(%s))"
