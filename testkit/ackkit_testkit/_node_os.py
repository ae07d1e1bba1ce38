"""What a throwaway node of the kit's own needs from the machine: where
``rabbitmq-server`` and ``erl_call`` are, which user the node runs as, a watchdog
that halts it once its test process is gone, and the reaping of nodes that dead
test runs left behind."""

from __future__ import annotations

import glob
import logging
import os
import re
import shutil
import sys

from ackkit.testing import BrokerUnavailable
from ackkit.testing.providers import ENV_NODE_USER, ENV_SERVER, SBIN_DIRS, pid_alive

from ._proc import iter_processes, kill_pid

log = logging.getLogger("ackkit.testing")


def _find_rabbitmq_server() -> str | None:
    """Path of the real ``rabbitmq-server`` script (not the Debian su-wrapper)."""
    explicit = os.environ.get(ENV_SERVER, "").strip()
    if explicit:
        if not os.access(explicit, os.X_OK):
            raise BrokerUnavailable(f"{ENV_SERVER}={explicit} is not an executable file")
        return os.path.realpath(explicit)
    path = os.pathsep.join([os.environ.get("PATH", ""), *SBIN_DIRS])
    found = shutil.which("rabbitmq-server", path=path)
    if not found:
        return None
    real = os.path.realpath(found)
    if os.path.basename(real) == "rabbitmq-script-wrapper":
        # Debian/RPM: the wrapper su's to the rabbitmq user with its HOME (and thus
        # cookie); the real scripts sit next to it.
        candidate = os.path.join(os.path.dirname(real), "rabbitmq-server")
        if os.access(candidate, os.X_OK):
            return candidate
    return real


def _find_erl_call() -> str | None:
    found = shutil.which("erl_call")
    if found:
        return found
    candidates: list[str] = []
    erl = shutil.which("erl")
    if erl:
        candidates.append(os.path.join(os.path.dirname(os.path.realpath(erl)), "erl_call"))
    candidates += ["/usr/lib/erlang/bin/erl_call", "/usr/local/lib/erlang/bin/erl_call"]
    for root in ("/usr/lib/erlang", "/usr/local/lib/erlang", "/opt/homebrew/lib/erlang"):
        candidates += sorted(glob.glob(f"{root}/lib/erl_interface-*/bin/erl_call"), reverse=True)
    for cand in candidates:
        if os.access(cand, os.X_OK):
            return cand
    return None


def _node_user() -> tuple[int, int] | None:
    """(uid, gid) to run an own node as, or None for the current user.

    As root the node drops to the ``rabbitmq`` user (what the distribution
    packages do); ``ACKKIT_TEST_NODE_USER`` picks another user ("root" keeps root).
    """
    if os.geteuid() != 0:
        return None
    import pwd

    name = os.environ.get(ENV_NODE_USER, "").strip() or "rabbitmq"
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        if os.environ.get(ENV_NODE_USER):
            raise BrokerUnavailable(f"{ENV_NODE_USER}={name}: no such user") from None
        return None
    if entry.pw_uid == 0:
        return None
    return entry.pw_uid, entry.pw_gid


def _proc_shows_all_pids() -> bool:
    """True on Linux with /proc mounted without ``hidepid`` (any user sees every pid)."""
    if not sys.platform.startswith("linux") or not os.path.isdir(f"/proc/{os.getpid()}"):
        return False
    try:
        with open("/proc/mounts", encoding="utf-8") as fh:
            for line in fh:
                fields = line.split()
                if len(fields) >= 4 and fields[1] == "/proc" and fields[2] == "proc":
                    opts = dict(o.partition("=")[::2] for o in fields[3].split(","))
                    return opts.get("hidepid", "0") in ("0", "off")
    except OSError:
        return False
    return False


def _owner_watchdog(owner: int) -> str:
    """Erlang ``-eval`` that halts the node once the owning test process is gone.

    atexit does not run when the test process is SIGKILLed; this stops such
    orphans within about a second (``_reap_orphans`` removes their directories
    on the next run). It polls /proc/<owner>, so it is only used where /proc
    shows every user's processes. The launcher script word-splits these
    arguments: no whitespace allowed.
    """
    if not _proc_shows_all_pids():
        return ""
    expr = (
        "spawn(fun()->W=fun(F)->(case(file:read_file_info("
        f'"/proc/{owner}"))of{{ok,_}}->timer:sleep(1000),F(F);'
        "_->erlang:halt(137)end)end,W(W)end)"
    )
    assert not any(c.isspace() for c in expr)
    return f" -eval {expr}"


_TAG_RE = re.compile(r"-ackkit_owner (\d+) -ackkit_base (\S+)")
_DIR_RE = re.compile(r"^ackkit-node-(\d+)-")


def _reap_dead_runs(parent: str) -> None:
    """Kill nodes (and remove data directories under ``parent``) left behind by dead
    test runs. ``provision_broker`` does this once per process (``_broker._reap_orphans``)."""
    live_bases: set[str] = set()
    for pid, cmdline in iter_processes():
        m = _TAG_RE.search(cmdline)
        if not m:
            continue
        owner, base = int(m.group(1)), m.group(2)
        if owner == os.getpid() or pid_alive(owner):
            live_bases.add(base)
            continue
        log.warning("killing RabbitMQ node left behind by dead test run %s (pid %s)", owner, pid)
        kill_pid(pid)
        shutil.rmtree(base, ignore_errors=True)
    try:
        entries = os.listdir(parent)
    except OSError:
        return
    for entry in entries:
        m = _DIR_RE.match(entry)
        path = os.path.join(parent, entry)
        if m and path not in live_bases and not pid_alive(int(m.group(1))):
            shutil.rmtree(path, ignore_errors=True)
