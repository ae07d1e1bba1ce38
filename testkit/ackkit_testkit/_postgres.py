"""A throwaway PostgreSQL for tests of the inbox: a DSN the user gives
(``ACKKIT_TEST_POSTGRES_DSN``), a cluster of the kit's own made with the machine's
server binaries (``initdb`` + ``pg_ctl``; as root it runs as the ``postgres`` user) in a
temporary directory, on a free port of 127.0.0.1, deleted at the end, or a container
on a Docker engine (:mod:`._provider_pg_docker`).

``ACKKIT_TEST_POSTGRES`` picks the way: ``auto`` (the default: the DSN when it is set,
else the server binaries, else a container when a Docker engine answers), ``dsn``,
``own`` or ``docker``."""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from ackkit.testing import mask_url
from ackkit.testing.providers import ENV_POSTGRES, POSTGRES_MODES, free_port
from ackkit.testing.providers import ENV_POSTGRES_DSN as ENV_DSN

BIN_GLOB = "/usr/lib/postgresql/*/bin"


class PostgresUnavailable(RuntimeError):
    """No PostgreSQL for the tests: neither a DSN nor server binaries."""


def server_bin() -> str | None:
    """The newest PostgreSQL server binaries directory on this machine (None: none)."""
    found = sorted(
        (d for d in glob.glob(BIN_GLOB) if os.path.exists(os.path.join(d, "initdb"))),
        key=lambda d: int(d.split("/")[-2]) if d.split("/")[-2].isdigit() else 0,
    )
    if found:
        return found[-1]
    initdb = shutil.which("initdb")
    return os.path.dirname(initdb) if initdb else None


@dataclass
class PostgresHandle:
    """A PostgreSQL the tests may use: `dsn`; `stop()`/`start()` only for the kit's own."""

    dsn: str
    own: bool = False
    _dir: str = ""
    _bin: str = ""
    _user: str | None = None
    _port: int = 0
    _log: str = field(default="", repr=False)

    def __repr__(self) -> str:
        return f"<PostgresHandle {mask_url(self.dsn)} own={self.own}>"

    def _ctl(self, *args: str) -> None:
        cmd = [os.path.join(self._bin, "pg_ctl"), "-D", os.path.join(self._dir, "data"), *args]
        _run(cmd, self._user)

    def start(self) -> None:
        """Start the kit's own server (again) and wait until it answers."""
        if not self.own:
            raise RuntimeError("only the kit's own PostgreSQL can be started or stopped")
        opts = f"-c listen_addresses=127.0.0.1 -p {self._port} -k {self._dir} -c fsync=off"
        self._ctl("-w", "-t", "60", "-l", self._log, "-o", opts, "start")

    def stop(self, mode: str = "fast") -> None:
        """Stop the kit's own server (`mode`: smart, fast or immediate)."""
        if not self.own:
            raise RuntimeError("only the kit's own PostgreSQL can be started or stopped")
        self._ctl("-w", "-m", mode, "stop")

    def close(self) -> None:
        if self.own:
            with contextlib.suppress(Exception):
                self.stop("immediate")
            shutil.rmtree(self._dir, ignore_errors=True)


def _run(cmd: list[str], user: str | None) -> None:
    if user is not None:
        cmd = ["runuser", "-u", user, "--", *cmd]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    if out.returncode != 0:
        raise PostgresUnavailable(
            f"{' '.join(cmd)} failed ({out.returncode}): {out.stderr.strip() or out.stdout}"
        )


HOW_TO_GET_POSTGRES = """\
How to get a PostgreSQL for the tests (any one of):
  * set ACKKIT_TEST_POSTGRES_DSN to a database the tests may create databases in
  * install the server binaries: apt-get install postgresql (Debian/Ubuntu), brew install postgresql
  * start a Docker engine (with testcontainers installed, the kit runs a PostgreSQL container)
Force one way with ACKKIT_TEST_POSTGRES=dsn|own|docker."""


def postgres_mode(explicit: str | None = None) -> str:
    """The way asked for: ``explicit``, else ``$ACKKIT_TEST_POSTGRES``, else "auto"."""
    mode = (explicit or os.environ.get(ENV_POSTGRES, "") or "auto").strip().lower()
    if mode not in POSTGRES_MODES:
        raise ValueError(f"{ENV_POSTGRES} must be one of {', '.join(POSTGRES_MODES)}: {mode!r}")
    return mode


def choose_postgres(
    mode: str, *, dsn: str, binaries: str | None, engine: Callable[[], tuple[bool, str]]
) -> str:
    """Which way gives the tests their PostgreSQL: "dsn", "own" or "docker".

    ``dsn``: ``ACKKIT_TEST_POSTGRES_DSN`` ("" when not set); ``binaries``: the server
    binaries directory (None: none); ``engine()``: (True, "") when a Docker engine
    answers, else (False, why); asked only when the choice depends on it.
    PostgresUnavailable, saying what was tried, when the way asked for cannot be had.
    """
    if mode == "dsn" or (mode == "auto" and dsn):
        if not dsn:
            raise PostgresUnavailable(f"{ENV_POSTGRES}=dsn but {ENV_DSN} is not set")
        return "dsn"
    if mode == "own" or (mode == "auto" and binaries):
        if not binaries:
            raise PostgresUnavailable(
                f"{ENV_POSTGRES}=own but no PostgreSQL server binaries were found "
                f"({BIN_GLOB}, or initdb on PATH)\n{HOW_TO_GET_POSTGRES}"
            )
        return "own"
    ok, why = engine()
    if ok:
        return "docker"
    if mode == "docker":
        raise PostgresUnavailable(f"{ENV_POSTGRES}=docker but {why}\n{HOW_TO_GET_POSTGRES}")
    raise PostgresUnavailable(
        f"no PostgreSQL for the tests. Tried:\n  - {ENV_DSN}: not set\n"
        f"  - server binaries: none in {BIN_GLOB} or on PATH\n  - Docker: {why}\n"
        + HOW_TO_GET_POSTGRES
    )


def provision_postgres(mode: str | None = None) -> Any:
    """A PostgreSQL for the tests, the way ``mode`` (default ``$ACKKIT_TEST_POSTGRES``,
    else "auto") asks: ``ACKKIT_TEST_POSTGRES_DSN``'s (a :class:`PostgresHandle` that is
    not the kit's own), a cluster of the kit's own (the machine's server binaries), or a
    container (a ``DockerPostgres``). PostgresUnavailable, saying what to do, when the
    way asked for cannot be had."""
    from ackkit.testing.providers import docker_engine

    dsn = os.environ.get(ENV_DSN, "").strip()
    bindir = server_bin()
    way = choose_postgres(postgres_mode(mode), dsn=dsn, binaries=bindir, engine=docker_engine)
    if way == "dsn":
        return PostgresHandle(dsn)
    if way == "docker":
        from ._provider_pg_docker import provision_docker_postgres

        return provision_docker_postgres()
    assert bindir is not None
    return _own_cluster(bindir)


def _own_cluster(bindir: str) -> PostgresHandle:
    """A throwaway cluster made with the server binaries of ``bindir``."""
    user = "postgres" if os.geteuid() == 0 else None
    base = tempfile.mkdtemp(prefix="ackkit-pg-")
    os.chmod(base, 0o755)
    if user is not None:
        shutil.chown(base, user, user)
    port = free_port()
    h = PostgresHandle(
        f"postgresql://postgres@127.0.0.1:{port}/postgres",
        own=True,
        _dir=base,
        _bin=bindir,
        _user=user,
        _port=port,
        _log=os.path.join(base, "server.log"),
    )
    try:
        _run(
            [
                os.path.join(bindir, "initdb"),
                "-D",
                os.path.join(base, "data"),
                "-U",
                "postgres",
                "-A",
                "trust",
                "--no-sync",
            ],
            user,
        )
        h.start()
    except BaseException:
        h.close()
        raise
    return h


@contextlib.contextmanager
def postgres() -> Iterator[Any]:
    """`provision_postgres()` as a context manager (the kit's own server removed after)."""
    h = provision_postgres()
    try:
        yield h
    finally:
        h.close()


def wait_postgres(dsn: str, timeout: float = 30.0) -> None:
    """Wait until `dsn` answers (after a restart)."""
    import psycopg

    deadline = time.monotonic() + timeout
    while True:
        try:
            with psycopg.connect(dsn, connect_timeout=2) as c:
                c.execute("SELECT 1")
            return
        except psycopg.Error:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
