"""A throwaway PostgreSQL for tests of the inbox: a DSN the user gives
(``ACKKIT_TEST_POSTGRES_DSN``), or a cluster of the kit's own made with the machine's
server binaries (``initdb`` + ``pg_ctl``; as root it runs as the ``postgres`` user) in a
temporary directory, on a free port of 127.0.0.1, deleted at the end."""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from ackkit.testing._env import ENV_POSTGRES_DSN as ENV_DSN
from ackkit.testing._util import free_port, mask_url

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


def provision_postgres() -> PostgresHandle:
    """A PostgreSQL for the tests: ``ACKKIT_TEST_POSTGRES_DSN`` if set, else a cluster of
    the kit's own (the machine's server binaries). PostgresUnavailable, saying what to
    do, when there is neither."""
    dsn = os.environ.get(ENV_DSN)
    if dsn:
        return PostgresHandle(dsn)
    bindir = server_bin()
    if bindir is None:
        raise PostgresUnavailable(
            "no PostgreSQL for the tests: set ACKKIT_TEST_POSTGRES_DSN to a database the "
            "tests may create tables in, or install the server (apt-get install postgresql)"
        )
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
def postgres() -> Iterator[PostgresHandle]:
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
