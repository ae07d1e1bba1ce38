"""Debian root file systems holding a newer RabbitMQ than the machine's own, or a
PostgreSQL server.

``ensure_root("4.3")`` returns a directory with a minimal Debian (``debootstrap
--variant=minbase``) and the ``rabbitmq-server`` package of the Debian suite
that carries that version. The root is built once and cached outside any
checkout (``/var/cache/ackkit/rootfs/rabbitmq-<version>``, or
``$ACKKIT_ROOTFS_DIR/rabbitmq-<version>``); the kit runs throwaway nodes inside
it (:mod:`._provider_chroot`) and a Docker image can be made from it.
``ensure_root("17", product="postgresql")`` does the same for the
``postgresql-17`` package, from which the kit's PostgreSQL
image is made (:mod:`._pg_image`).

Building needs root (debootstrap, chroot), the ``debootstrap`` program and a
reachable Debian mirror (the one apt uses, or ``$ACKKIT_DEBIAN_MIRROR``).
Concurrent callers wait on a file lock; the root is built in a temporary
directory inside a private mount namespace and renamed into place at the end,
so a killed build never leaves a half root behind (the next build removes it).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import glob
import json
import logging
import os
import pathlib
import re
import secrets
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

from ackkit.testing import BrokerUnavailable

__all__ = ["ROOTFS_VERSIONS", "RootfsUnavailable", "ensure_root", "root_version"]

log = logging.getLogger("ackkit.testing")

ENV_ROOTFS_DIR = "ACKKIT_ROOTFS_DIR"
ENV_MIRROR = "ACKKIT_DEBIAN_MIRROR"
DEFAULT_ROOTFS_DIR = "/var/cache/ackkit/rootfs"
DEFAULT_MIRROR = "http://deb.debian.org/debian"
SCRIPTS_DIR = "/usr/share/debootstrap/scripts"
MARKER = ".ackkit-rootfs.json"
_HOSTS = "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"


@dataclasses.dataclass(frozen=True)
class _Suite:
    suite: str
    script: str  # debootstrap script name (the suite's own, or an older one that works)
    package: str = "rabbitmq-server"  # the package debootstrap adds (--include)


# RabbitMQ series -> the Debian suite whose rabbitmq-server package is of that series.
_SUITES = {
    "4.0": _Suite("trixie", "trixie"),  # Debian 13: RabbitMQ 4.0.5, Erlang 27
    "4.3": _Suite("forky", "sid"),  # Debian testing: RabbitMQ 4.3.6, Erlang 29
}
ROOTFS_VERSIONS = tuple(_SUITES)
# PostgreSQL major version -> the Debian suite that carries it.
_PG_SUITES = {
    "15": _Suite("bookworm", "bookworm", "postgresql-15"),  # Debian 12
    "17": _Suite("trixie", "trixie", "postgresql-17"),  # Debian 13
}
_PRODUCTS = {"rabbitmq": _SUITES, "postgresql": _PG_SUITES}

ALTERNATIVES = """\
Other ways to test against RabbitMQ {version}:
  * point the tests at a running {version} broker:  export AMQP_URL=amqp://guest:guest@<host>:5672/%2f
  * start a Docker engine (the kit then runs a rabbitmq:{version} container through testcontainers)
  * test against the machine's own RabbitMQ instead:  ACKKIT_TEST_RABBITMQ=3.10"""
PG_ALTERNATIVES = """\
Other ways to get a PostgreSQL {version} for the tests:
  * point the tests at a running server:  export ACKKIT_TEST_POSTGRES_DSN=postgresql://...
  * use the machine's own server binaries:  ACKKIT_TEST_POSTGRES=own (apt-get install postgresql)
  * name an image the engine can pull:  ACKKIT_TEST_POSTGRES_IMAGE=postgres:{version}"""


class RootfsUnavailable(BrokerUnavailable):
    """A root file system with the wanted RabbitMQ cannot be built here."""


def _fail(version: str, why: str, product: str = "rabbitmq") -> RootfsUnavailable:
    other = PG_ALTERNATIVES if product == "postgresql" else ALTERNATIVES
    return RootfsUnavailable(f"{why}\n{other.format(version=version)}")


def cache_dir() -> pathlib.Path:
    return pathlib.Path(os.environ.get(ENV_ROOTFS_DIR, "").strip() or DEFAULT_ROOTFS_DIR)


def root_version(root: pathlib.Path, package: str = "rabbitmq-server") -> str | None:
    """Version of ``package`` installed in ``root`` (dpkg's record)."""
    try:
        text = (root / "var/lib/dpkg/status").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    for stanza in text.split("\n\n"):
        fields = dict(
            line.split(":", 1) for line in stanza.splitlines() if ":" in line and line[0] != " "
        )
        if fields.get("Package", "").strip() == package:
            status = fields.get("Status", "")
            if "installed" in status.split():
                return fields.get("Version", "").strip() or None
    return None


def _matches(version: str, installed: str | None) -> bool:
    return installed is not None and installed.startswith(version + ".")


def _usable(root: pathlib.Path, version: str, package: str = "rabbitmq-server") -> bool:
    return (root / MARKER).is_file() and _matches(version, root_version(root, package))


def ensure_root(version: str, product: str = "rabbitmq") -> pathlib.Path:
    """The cached Debian root with RabbitMQ ``version`` ("4.0" or "4.3"), or with
    PostgreSQL ``version`` ("15" or "17") for ``product="postgresql"``; built on first use.

    Raises :class:`RootfsUnavailable` (a ``BrokerUnavailable``) saying why and what else
    to do when it cannot be built here.
    """
    version = version.strip()
    suites = _PRODUCTS[product]
    what = "PostgreSQL" if product == "postgresql" else "RabbitMQ"
    if version not in suites:
        raise ValueError(
            f"no Debian root is known for {what} {version!r}; known: {', '.join(suites)}"
        )
    base = cache_dir()
    name = f"{product}-{version}"
    root = base / name
    package = suites[version].package
    if _usable(root, version, package):
        return root
    if os.geteuid() != 0:
        raise _fail(
            version,
            f"{what} {version} runs from a Debian root at {root}, which is not built yet, and "
            "building it needs root (debootstrap, chroot). Run the tests once as root, or build "
            f"the root as root elsewhere and point {ENV_ROOTFS_DIR} at its parent directory.",
            product,
        )
    debootstrap = shutil.which("debootstrap", path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin")
    if debootstrap is None:
        raise _fail(
            version,
            f"{what} {version} runs from a Debian root that is built with debootstrap, which is "
            "not installed: apt-get install -y debootstrap",
            product,
        )
    try:
        base.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise _fail(version, f"cannot create the root cache {base}: {exc}", product) from exc
    with _locked(base / f".{name}.lock"):
        if _usable(root, version, package):  # another process built it while we waited
            return root
        _remove_leftovers(base, version, product)
        if root.exists():
            log.warning("replacing the unusable root %s", root)
            _safe_rmtree(root)
        _build(version, root, debootstrap, product)
    return root


@contextlib.contextmanager
def _locked(path: pathlib.Path) -> Iterator[None]:
    with open(path, "a+b") as fh:
        started = time.monotonic()
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.info("waiting for another process building the root (%s)", path)
            fcntl.flock(fh, fcntl.LOCK_EX)
            log.info("root lock %s free after %.1fs", path, time.monotonic() - started)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _mounts_under(path: pathlib.Path) -> list[str]:
    """Mount points at or below ``path`` (deepest first), from /proc/self/mountinfo."""
    prefix = os.path.realpath(path)
    found = []
    with contextlib.suppress(OSError), open("/proc/self/mountinfo", encoding="utf-8") as fh:
        for line in fh:
            fields = line.split()
            if len(fields) < 5:
                continue
            point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4])
            if point == prefix or point.startswith(prefix + "/"):
                found.append(point)
    return sorted(found, key=len, reverse=True)


def _safe_rmtree(path: pathlib.Path) -> None:
    """Remove ``path``, never through a mount (a bind-mounted /dev would lose the host's)."""
    for point in _mounts_under(path):
        subprocess.run(["umount", "-l", point], check=False, capture_output=True)
    left = _mounts_under(path)
    if left:
        raise RootfsUnavailable(f"cannot remove {path}: still mounted there: {', '.join(left)}")
    shutil.rmtree(path, ignore_errors=True)


def _remove_leftovers(base: pathlib.Path, version: str, product: str = "rabbitmq") -> None:
    """Temporary directories of killed builds (the caller holds the version's lock)."""
    for stale in glob.glob(str(base / f".building-{product}-{version}-*")):
        log.warning("removing %s, left behind by an interrupted root build", stale)
        _safe_rmtree(pathlib.Path(stale))


def _mirror() -> str:
    explicit = os.environ.get(ENV_MIRROR, "").strip()
    if explicit:
        return explicit.rstrip("/")
    for path in sorted(glob.glob("/etc/apt/sources.list.d/*.sources")):
        with contextlib.suppress(OSError), open(path, encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("URIs:") and "debian" in line and "security" not in line:
                    return line.split()[1].rstrip("/")
    for path in ["/etc/apt/sources.list", *sorted(glob.glob("/etc/apt/sources.list.d/*.list"))]:
        with contextlib.suppress(OSError), open(path, encoding="utf-8") as fh:
            for line in fh:
                words = line.split()
                if words[:1] == ["deb"] and "debian" in line and "security" not in line:
                    uris = [w for w in words[1:] if "://" in w]
                    if uris:
                        return uris[0].rstrip("/")
    return DEFAULT_MIRROR


def _check_mirror(version: str, mirror: str, suite: str, product: str = "rabbitmq") -> None:
    url = f"{mirror}/dists/{suite}/Release"
    try:
        with urllib.request.urlopen(url, timeout=20) as resp:
            resp.read(64)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise _fail(
            version,
            f"the Debian mirror {mirror} does not answer for suite {suite!r} ({url}: {exc}). "
            f"Set {ENV_MIRROR} to a reachable Debian mirror.",
            product,
        ) from exc


def _script(suite: _Suite) -> str:
    own = os.path.join(SCRIPTS_DIR, suite.suite)
    return own if os.path.exists(own) else os.path.join(SCRIPTS_DIR, suite.script)


def _pdeathsig() -> None:
    """In the child: die with the parent (a killed test run leaves no build running)."""
    import ctypes

    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _build(version: str, root: pathlib.Path, debootstrap: str, product: str) -> None:
    suite = _PRODUCTS[product][version]
    what = "PostgreSQL" if product == "postgresql" else "RabbitMQ"
    mirror = _mirror()
    _check_mirror(version, mirror, suite.suite, product)
    tmp = root.parent / f".building-{root.name}-{os.getpid()}-{secrets.token_hex(3)}"
    logfile = root.parent / f"{root.name}.build.log"
    # A private mount namespace: debootstrap's /proc and /sys mounts in the new root
    # vanish with it, even when it is killed.
    cmd = ["unshare", "--mount", "--propagation", "private", debootstrap]
    cmd += ["--variant=minbase", f"--include={suite.package}", suite.suite, str(tmp), mirror]
    cmd.append(_script(suite))
    log.warning("building a Debian %s root with %s %s at %s", suite.suite, what, version, root)
    started = time.monotonic()
    try:
        with open(logfile, "wb") as out:
            proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_pdeathsig,
            )
            try:
                rc = proc.wait()
            except BaseException:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                raise
        if rc != 0:
            text = logfile.read_text(encoding="utf-8", errors="replace").splitlines()
            raise _fail(
                version,
                f"debootstrap of Debian {suite.suite} from {mirror} failed (exit {rc}); "
                f"log {logfile}:\n" + "\n".join(text[-25:]),
                product,
            )
        installed = root_version(tmp, suite.package)
        if not _matches(version, installed):
            raise _fail(
                version,
                f"Debian {suite.suite} ({mirror}) now carries {suite.package} {installed}, "
                f"not {what} {version}.x; the kit's table of suites needs an update.",
                product,
            )
        _finish(tmp, version, suite, mirror)
        os.rename(tmp, root)
    finally:
        if tmp.exists():
            _safe_rmtree(tmp)
    log.warning(
        "Debian root with %s %s ready at %s in %.0fs", what, version, root,
        time.monotonic() - started,
    )  # fmt: skip


def _finish(tmp: pathlib.Path, version: str, suite: _Suite, mirror: str) -> None:
    """What a node needs in the root besides the packages; the marker goes last."""
    (tmp / "etc/hosts").write_text(_HOSTS, encoding="ascii")  # else epmd: nxdomain
    for deb in glob.glob(str(tmp / "var/cache/apt/archives/*.deb")):
        os.unlink(deb)
    marker = {
        suite.package: root_version(tmp, suite.package),
        "version": version,
        "suite": suite.suite,
        "mirror": mirror,
        "built": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    (tmp / MARKER).write_text(json.dumps(marker, indent=1) + "\n", encoding="utf-8")
