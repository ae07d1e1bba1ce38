"""A throwaway RabbitMQ node of the kit's own, started from ``rabbitmq-server``.

Its own data directory, ports, node name and Erlang cookie; removed when the
handle closes (or at exit). The kit may stop, start, restart and kill it.
What the node needs from the machine (binaries, user, watchdog, reaping of
nodes of dead runs) is in :mod:`._node_os`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import logging
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

from ._commands import _check, _run
from ._env import ENV_BOOT_TIMEOUT, ENV_NODE_DIR, _env_float
from ._errors import BrokerError, BrokerUnavailable
from ._handle import BrokerHandle
from ._node_os import _find_erl_call, _node_user, _owner_watchdog
from ._registry import _register, _unregister
from ._util import free_port, iter_processes, kill_pid, pid_alive, tail

log = logging.getLogger("ackkit.testing")


@dataclasses.dataclass(frozen=True)
class NodeTLS:
    """PEM files for a TLS (amqps) listener on a broker node of the kit's own.

    ``verify_peer``: ask clients for a certificate and check it against ``ca_file``;
    ``fail_if_no_peer_cert``: refuse clients that present none (client certificates
    required). The node copies the files into its data directory.
    """

    ca_file: str
    cert_file: str
    key_file: str
    verify_peer: bool = True
    fail_if_no_peer_cert: bool = False


class _OwnNode(BrokerHandle):
    """A throwaway RabbitMQ node: own data dir, ports, node name and Erlang cookie.

    The node runs ``rabbitmq-server`` in the foreground as a child process (as the
    ``rabbitmq`` user when we are root). Its HOME is its data directory, which
    holds a random Erlang cookie; rabbitmqctl and erl_call run with the same HOME
    and user, so they always present the right cookie.
    """

    kind = "own"

    def __init__(
        self,
        server: str,
        *,
        reap_orphans: Callable[[str], None],
        boot_timeout: float | None = None,
        tls: NodeTLS | None = None,
    ) -> None:
        """``reap_orphans(parent)`` runs before the data directory is made under
        ``parent``; ``provision_broker`` passes its once-per-process reaper."""
        self._server = server
        self._tls = tls
        self.amqps_port: int | None = None
        self._ctl_exe = os.path.join(os.path.dirname(server), "rabbitmqctl")
        self._erl_call = _find_erl_call()
        self._user = _node_user()
        self._boot_timeout = boot_timeout or _env_float(ENV_BOOT_TIMEOUT, 60.0)
        self._proc: subprocess.Popen[bytes] | None = None
        self._lock = threading.RLock()
        self.boot_seconds: float | None = None

        parent = os.environ.get(ENV_NODE_DIR) or (
            "/tmp" if self._user is not None and os.path.isdir("/tmp") else tempfile.gettempdir()
        )
        reap_orphans(parent)
        self._base = tempfile.mkdtemp(prefix=f"ackkit-node-{os.getpid()}-", dir=parent)
        name = f"ackkit-test-{os.getpid()}-{secrets.token_hex(3)}@localhost"
        super().__init__("", own=True, amqp_port=0, node_name=name)
        _register(self)
        try:
            self._prepare_dir()
            self._boot_with_port_retry()
        except BaseException:
            self.close()
            raise

    # -- files ------------------------------------------------------------------

    def _path(self, *parts: str) -> str:
        return os.path.join(self._base, *parts)

    def _prepare_dir(self) -> None:
        for sub in ("mnesia", "log", "conf.d"):
            os.makedirs(self._path(sub), exist_ok=True)
        if self._tls is not None:
            os.makedirs(self._path("tls"), exist_ok=True)
            for name, src in self._tls_files().items():
                shutil.copyfile(src, self._path("tls", name))
                os.chmod(self._path("tls", name), 0o400)
        with open(self._path("enabled_plugins"), "w", encoding="ascii") as fh:
            fh.write("[].\n")
        with open(self._path("rabbitmq-env.conf"), "w", encoding="ascii") as fh:
            fh.write(
                "# throwaway node of the ackkit test kit; settings come from the environment\n"
            )
        cookie = self._path(".erlang.cookie")
        with open(cookie, "w", encoding="ascii") as fh:
            fh.write(secrets.token_hex(20).upper())
        os.chmod(cookie, 0o400)
        if self._user is not None:
            uid, gid = self._user
            for root, dirs, files in os.walk(self._base):
                os.chown(root, uid, gid)
                for item in dirs + files:
                    os.chown(os.path.join(root, item), uid, gid)

    def _tls_files(self) -> dict[str, str]:
        tls = self._tls
        assert tls is not None
        return {"ca.pem": tls.ca_file, "cert.pem": tls.cert_file, "key.pem": tls.key_file}

    def _write_config(self) -> None:
        path = self._path("rabbitmq.conf")
        with open(path, "w", encoding="ascii") as fh:
            fh.write(
                f"listeners.tcp.local = 127.0.0.1:{self.amqp_port}\n"
                "loopback_users.guest = true\n"
                "log.console = false\n"
                "log.file.level = info\n"
            )
            tls = self._tls
            if tls is not None:
                fh.write(
                    f"listeners.ssl.local = 127.0.0.1:{self.amqps_port}\n"
                    f"ssl_options.cacertfile = {self._path('tls', 'ca.pem')}\n"
                    f"ssl_options.certfile = {self._path('tls', 'cert.pem')}\n"
                    f"ssl_options.keyfile = {self._path('tls', 'key.pem')}\n"
                    "ssl_options.verify = "
                    + ("verify_peer" if tls.verify_peer else "verify_none")
                    + "\n"
                    "ssl_options.fail_if_no_peer_cert = "
                    + ("true" if tls.fail_if_no_peer_cert else "false")
                    + "\n"
                )
        if self._user is not None:
            os.chown(path, *self._user)

    def _env(self) -> dict[str, str]:
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith("RABBITMQ_")
            and k not in {"ERL_FLAGS", "ERL_AFLAGS", "ERL_ZFLAGS", "ERL_LIBS", "HOME"}
        }
        env.update(
            HOME=self._base,
            RABBITMQ_NODENAME=str(self.node_name),
            RABBITMQ_NODE_IP_ADDRESS="127.0.0.1",
            RABBITMQ_NODE_PORT=str(self.amqp_port),
            RABBITMQ_DIST_PORT=str(self._dist_port),
            RABBITMQ_MNESIA_BASE=self._path("mnesia"),
            RABBITMQ_LOG_BASE=self._path("log"),
            RABBITMQ_LOGS=self._path("log", "node.log"),
            RABBITMQ_ENABLED_PLUGINS_FILE=self._path("enabled_plugins"),
            RABBITMQ_CONFIG_FILE=self._path("rabbitmq.conf"),
            RABBITMQ_CONFIG_FILES=self._path("conf.d"),
            RABBITMQ_ADVANCED_CONFIG_FILE=self._path("advanced.config"),
            RABBITMQ_CONF_ENV_FILE=self._path("rabbitmq-env.conf"),
            RABBITMQ_PID_FILE=self._path("node.pid"),
            RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS=(
                "-kernel inet_dist_use_interface {127,0,0,1} "
                f"-ackkit_owner {os.getpid()} -ackkit_base {self._base}"
                + _owner_watchdog(os.getpid())
            ),
            ERL_CRASH_DUMP=self._path("log", "erl_crash.dump"),
        )
        env.setdefault("ERL_EPMD_ADDRESS", "127.0.0.1")
        locale = env.get("LC_ALL") or env.get("LC_CTYPE") or env.get("LANG") or ""
        if "utf-8" not in locale.lower() and "utf8" not in locale.lower():
            env["LC_ALL"] = "C.UTF-8" if sys.platform.startswith("linux") else "en_US.UTF-8"
        return env

    # -- process ----------------------------------------------------------------

    def _boot_with_port_retry(self) -> None:
        for attempt in range(3):
            self.amqp_port = free_port()
            self._dist_port = free_port(avoid=frozenset({self.amqp_port}))
            if self._tls is not None:
                self.amqps_port = free_port(avoid=frozenset({self.amqp_port, self._dist_port}))
            self._url = f"amqp://guest:guest@127.0.0.1:{self.amqp_port}/%2f"
            self._write_config()
            try:
                self._spawn_and_wait()
                return
            except BrokerUnavailable as exc:
                if attempt < 2 and "eaddrinuse" in str(exc).lower():
                    log.info(
                        "port clash while booting %s, retrying with other ports", self.node_name
                    )
                    continue
                raise

    def _spawn(self) -> None:
        kwargs: dict[str, Any] = {}
        if self._user is not None:
            kwargs.update(user=self._user[0], group=self._user[1], extra_groups=[])
        with open(self._path("log", "console.log"), "ab") as console:
            self._proc = subprocess.Popen(
                [self._server],
                env=self._env(),
                cwd=self._base,
                stdin=subprocess.DEVNULL,
                stdout=console,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                **kwargs,
            )

    def _log_tails(self) -> str:
        parts = []
        for name in ("console.log", "node.log"):
            text = tail(self._path("log", name), 30)
            if text:
                parts.append(f"--- {self._path('log', name)} (last lines) ---\n{text}")
        return "\n".join(parts) or "(the node wrote no log)"

    def _spawn_and_wait(self) -> None:
        started = time.monotonic()
        self._spawn()
        assert self._proc is not None
        deadline = started + self._boot_timeout
        while True:
            rc = self._proc.poll()
            if rc is not None:
                self._proc = None
                raise BrokerUnavailable(
                    f"the throwaway RabbitMQ node {self.node_name} ({self._server}) exited with "
                    f"code {rc} while booting.\n{self._log_tails()}"
                )
            if self.ping(timeout=5.0):
                break
            if time.monotonic() > deadline:
                tails = self._log_tails()
                self._terminate()
                raise BrokerUnavailable(
                    f"the throwaway RabbitMQ node {self.node_name} did not answer AMQP on port "
                    f"{self.amqp_port} within {self._boot_timeout:.0f}s "
                    f"(raise {ENV_BOOT_TIMEOUT} if the machine is slow).\n{tails}"
                )
            time.sleep(0.1)
        self.boot_seconds = time.monotonic() - started
        log.info(
            "RabbitMQ node %s up in %.1fs at %s", self.node_name, self.boot_seconds, self.masked_url
        )

    def _beam_pids(self) -> list[int]:
        tag = f"-ackkit_base {self._base}"
        return [pid for pid, cmd in iter_processes() if tag in cmd and pid != os.getpid()]

    def _terminate(self, timeout: float = 30.0) -> None:
        """Graceful stop (SIGTERM), then SIGKILL whatever is left of the node."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                log.warning(
                    "node %s ignored SIGTERM for %.0fs, killing it", self.node_name, timeout
                )
        self._kill_processes(proc)

    def _kill_processes(self, proc: subprocess.Popen[bytes] | None) -> None:
        """SIGKILL the node's VM, let its launcher script exit, and wait for both."""
        beams = self._beam_pids()
        for pid in beams:
            kill_pid(pid)
        deadline = time.monotonic() + 15
        # Wait for the very pids we killed: a dying VM can already have lost its
        # command line (and so vanish from a scan) while its port is still bound.
        while any(pid_alive(pid) for pid in beams) and time.monotonic() < deadline:
            time.sleep(0.02)
        if proc is not None:
            # The launcher shell reaps the VM and exits by itself; kill it only if not.
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                kill_pid(proc.pid)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(5)
        for pid in self._beam_pids():  # anything that slipped through (e.g. a re-exec)
            kill_pid(pid)
        self._proc = None

    # -- public control -----------------------------------------------------------

    def is_running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def amqps_url(self) -> str | None:
        """``amqps://`` URL of the TLS listener (``tls=`` given to ``provision_broker``)."""
        if self.amqps_port is None:
            return None
        return f"amqps://guest:guest@127.0.0.1:{self.amqps_port}/%2f"

    def log_text(self) -> str | None:
        texts = []
        for name in sorted(glob.glob(self._path("log", "*.log"))):
            if os.path.basename(name) == "console.log":
                continue
            with contextlib.suppress(OSError), open(name, encoding="utf-8", errors="replace") as fh:
                texts.append(fh.read())
        return "".join(texts)

    def stop(self) -> None:
        """Clean shutdown of the node (its data stays for ``start()``)."""
        with self._lock:
            self._terminate()

    def start(self) -> None:
        """Boot the node again (same name, ports and data); no-op when it runs."""
        with self._lock:
            if self._closed:
                raise BrokerError(f"{self!r} is closed")
            if self.is_running():
                return
            self._spawn_and_wait()

    def restart(self) -> None:
        with self._lock:
            self.stop()
            self.start()

    def kill(self, *, flush_metadata: bool = True) -> None:
        with self._lock:
            if flush_metadata and self.is_running():
                self._sync_metadata()
            self._kill_processes(self._proc)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            try:
                # The data is thrown away, so no clean shutdown is needed.
                self._kill_processes(self._proc)
            finally:
                _unregister(self)
                shutil.rmtree(self._base, ignore_errors=True)

    # -- rabbitmqctl / erl_call -------------------------------------------------------

    def ctl(self, *args: str, timeout: float = 60.0) -> str:
        cmd = [self._ctl_exe, "-n", str(self.node_name), *args]
        res = _run(
            cmd,
            what="rabbitmqctl",
            timeout=timeout,
            env=self._env(),
            cwd=self._base,
            user=self._user,
        )
        return _check(res, "rabbitmqctl", args)

    def _erl_eval(self, expr: str) -> str | None:
        if self._erl_call is None or not self.is_running():
            return None
        cmd = [self._erl_call, "-sname", str(self.node_name), "-timeout", "10", "-e"]
        try:
            res = _run(
                cmd,
                what="erl_call",
                timeout=15,
                env=self._env(),
                cwd=self._base,
                user=self._user,
                input_text=expr + "\n",
            )
        except BrokerError as exc:
            log.debug("erl_call failed: %s", exc)
            return None
        m = re.fullmatch(r'\{ok,\s*"OK;(.*)"\}', res.stdout.strip(), re.S)
        if res.returncode != 0 or m is None:
            log.debug("erl_call gave %s: %r %r", res.returncode, res.stdout[:300], res.stderr[:300])
            return None
        return m.group(1)

    def close_connections(self, reason: str = "closed by the ackkit test kit") -> None:
        # The broker sends connection.close to every client at once; a client sees it
        # as soon as it reads from its socket (ConnectionClosedByBroker, code 320).
        self.ctl("close_all_connections", "--global", reason)
