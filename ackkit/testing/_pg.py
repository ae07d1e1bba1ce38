"""The PostgreSQL of the ``postgres`` / ``postgres_dsn`` fixtures: the database of
``ACKKIT_TEST_POSTGRES_DSN`` (used as it is), else a throwaway server of the kit's own,
which ackkit-testkit makes from the machine's server binaries or runs in a container
on a Docker engine. ``ACKKIT_TEST_POSTGRES=auto|dsn|own|docker`` forces a way."""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from typing import Any

from . import _kit
from ._env import ENV_POSTGRES, ENV_POSTGRES_DSN, POSTGRES_MODES
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


def provision_postgres(mode: str | None = None) -> Any:
    """``ExternalPostgres`` for ``ACKKIT_TEST_POSTGRES_DSN``, else ackkit-testkit's
    throwaway server (the caller closes it). ``mode`` (default ``$ACKKIT_TEST_POSTGRES``,
    else "auto"): "dsn" insists on the DSN, "own" / "docker" on the kit's cluster from
    the server binaries / its container, even when the DSN is set."""
    mode = (mode or os.environ.get(ENV_POSTGRES, "") or "auto").strip().lower()
    if mode not in POSTGRES_MODES:
        raise ValueError(f"{ENV_POSTGRES} must be one of {', '.join(POSTGRES_MODES)}: {mode!r}")
    dsn = os.environ.get(ENV_POSTGRES_DSN, "").strip()
    if mode == "dsn" or (mode == "auto" and dsn):
        if not dsn:
            raise ValueError(f"{ENV_POSTGRES}=dsn but {ENV_POSTGRES_DSN} is not set")
        return ExternalPostgres(dsn)
    kit = _kit.require(
        "a PostgreSQL of the kit's own",
        instead=f"set {ENV_POSTGRES_DSN} to a database the tests may create databases in",
    )
    return kit.provision_postgres(mode)


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
