"""The PostgreSQL of the ``postgres`` / ``postgres_dsn`` fixtures: the database of
``ACKKIT_TEST_POSTGRES_DSN`` (used as it is), else a throwaway cluster of the kit's
own, which ackkit-testkit makes from the machine's server binaries."""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from typing import Any

from . import _kit
from ._env import ENV_POSTGRES_DSN
from ._util import mask_url

__all__ = ["ExternalPostgres", "fresh_database", "provision_postgres"]


class ExternalPostgres:
    """The PostgreSQL of ``ACKKIT_TEST_POSTGRES_DSN``: never started, stopped or removed."""

    own = False

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn

    def __repr__(self) -> str:
        return f"<ExternalPostgres {mask_url(self.dsn)} own=False>"

    def start(self) -> None:
        raise RuntimeError("only the kit's own PostgreSQL can be started or stopped")

    stop = start

    def close(self) -> None:
        pass


def provision_postgres() -> Any:
    """``ExternalPostgres`` for ``ACKKIT_TEST_POSTGRES_DSN``, else ackkit-testkit's
    throwaway cluster (its ``PostgresHandle``; the caller closes it)."""
    dsn = os.environ.get(ENV_POSTGRES_DSN, "").strip()
    if dsn:
        return ExternalPostgres(dsn)
    kit = _kit.require(
        "a PostgreSQL of the kit's own",
        instead=f"set {ENV_POSTGRES_DSN} to a database the tests may create databases in",
    )
    return kit.provision_postgres()


def fresh_database(server_dsn: str, slug: str) -> Iterator[str]:
    """Create a database named after ``slug`` on ``server_dsn``, yield its DSN, drop it."""
    import psycopg
    from psycopg import sql

    name = f"t_{slug}_{secrets.token_hex(3)}"
    with psycopg.connect(server_dsn, autocommit=True) as c:
        c.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    info = psycopg.conninfo.conninfo_to_dict(server_dsn)
    info["dbname"] = name
    yield psycopg.conninfo.make_conninfo(**info)  # type: ignore[arg-type]
    try:
        with psycopg.connect(server_dsn, autocommit=True) as c:
            c.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )
    except psycopg.Error:
        pass  # a server the test stopped: its cluster goes at the end anyway
