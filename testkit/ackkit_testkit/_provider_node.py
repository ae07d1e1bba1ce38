"""A throwaway RabbitMQ node of the kit's own, started from ``rabbitmq-server``.

Its own data directory, ports, node name and Erlang cookie; removed when the
handle closes (or at exit). The kit may stop, start, restart and kill it.
What the node needs from the machine (binaries, user, watchdog, reaping of
nodes of dead runs) is in :mod:`._node_os`.
"""

from __future__ import annotations

import contextlib
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

from ackkit.testing import BrokerError, BrokerHandle, BrokerUnavailable, NodeTLS
from ackkit.testing.providers import (
    ENV_BOOT_TIMEOUT,
    ENV_NODE_DIR,
    check_command,
    count_run,
    env_float,
    free_port,
    pid_alive,
    register_broker,
    run_command,
    unregister_broker,
)

from ._node_files import _NodeFiles
from ._node_os import _find_erl_call, _node_user, _owner_watchdog
from ._proc import iter_processes, kill_pid

log = logging.getLogger("ackkit.testing")


class _OwnNode(_NodeFiles, BrokerHandle):
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
        streams: bool = False,
        cookie: str | None = None,
        more_config: str = "",
        advanced_config: str = "",
        name_tag: str = "",
    ) -> None:
        """``reap_orphans(parent)`` runs before the data directory is made under
        ``parent``; ``provision_broker`` passes its once-per-process reaper.
        ``streams``: also run the ``rabbitmq_stream`` plugin, on ``stream_port``.
        ``cookie``, ``more_config``, ``advanced_config`` and ``name_tag`` are a
        cluster's (:mod:`._cluster`): the Erlang cookie its nodes share, rabbitmq.conf
        lines and an advanced.config of their own, and a tag in the node name
        (``ackkit-test-<pid>-<tag><rand>@localhost``)."""
        self._server = server
        self._tls = tls
        self._streams = streams
        self._cookie = cookie
        self._more_config = more_config
        self._advanced_config = advanced_config
        self.stream_port = None
        self.amqps_port: int | None = None
        self._ctl_exe = os.path.join(os.path.dirname(server), "rabbitmqctl")
        self._erl_call = _find_erl_call()
        self._user = self._node_owner()
        self._boot_timeout = boot_timeout or env_float(ENV_BOOT_TIMEOUT, 60.0)
        self._proc: subprocess.Popen[bytes] | None = None
        self._lock = threading.RLock()
        self.boot_seconds: float | None = None

        parent = self._data_parent()
        reap_orphans(parent)
        self._base = tempfile.mkdtemp(prefix=f"ackkit-node-{os.getpid()}-", dir=parent)
        name = f"ackkit-test-{os.getpid()}-{name_tag}{secrets.token_hex(3)}@localhost"
        super().__init__("", own=True, amqp_port=0, node_name=name)
        register_broker(self)
        try:
            self._prepare_dir()
            self._boot_with_port_retry()
        except BaseException:
            self.close()
            raise

    # -- environment and commands -----------------------------------------------

    def _data_parent(self) -> str:
        """Where the node's data directory is made."""
        return os.environ.get(ENV_NODE_DIR) or (
            "/tmp" if self._user is not None and os.path.isdir("/tmp") else tempfile.gettempdir()
        )

    def _node_owner(self) -> tuple[int, int] | None:
        """(uid, gid) that owns the node's files and runs it (None: the current user)."""
        return _node_user()

    def _run_as(self) -> tuple[int, int] | None:
        """(uid, gid) the kit starts the node's programs as (None: as itself)."""
        return self._user

    def _server_argv(self) -> list[str]:
        return [self._server]

    def _ctl_argv(self, *args: str) -> list[str]:
        return [self._ctl_exe, "-n", str(self.node_name), *args]

    def _erl_call_argv(self) -> list[str] | None:
        if self._erl_call is None:
            return None
        return [self._erl_call, "-sname", str(self.node_name), "-timeout", "10", "-e"]

    def _env(self) -> dict[str, str]:
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith("RABBITMQ_")
            and k not in {"ERL_FLAGS", "ERL_AFLAGS", "ERL_ZFLAGS", "ERL_LIBS", "HOME"}
        }
        env.update(
            HOME=self._inner(),
            RABBITMQ_NODENAME=str(self.node_name),
            RABBITMQ_NODE_IP_ADDRESS="127.0.0.1",
            RABBITMQ_NODE_PORT=str(self.amqp_port),
            RABBITMQ_DIST_PORT=str(self._dist_port),
            RABBITMQ_MNESIA_BASE=self._inner("mnesia"),
            RABBITMQ_LOG_BASE=self._inner("log"),
            RABBITMQ_LOGS=self._inner("log", "node.log"),
            RABBITMQ_ENABLED_PLUGINS_FILE=self._inner("enabled_plugins"),
            RABBITMQ_CONFIG_FILE=self._inner("rabbitmq.conf"),
            RABBITMQ_CONFIG_FILES=self._inner("conf.d"),
            RABBITMQ_ADVANCED_CONFIG_FILE=self._inner("advanced.config"),
            RABBITMQ_CONF_ENV_FILE=self._inner("rabbitmq-env.conf"),
            RABBITMQ_PID_FILE=self._inner("node.pid"),
            RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS=(
                "-kernel inet_dist_use_interface {127,0,0,1} "
                f"-ackkit_owner {os.getpid()} -ackkit_base {self._base}"
                + _owner_watchdog(os.getpid())
            ),
            ERL_CRASH_DUMP=self._inner("log", "erl_crash.dump"),
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
            if self._streams:
                taken = {self.amqp_port, self._dist_port, self.amqps_port or 0}
                self.stream_port = free_port(avoid=frozenset(taken))
            self._url = f"amqp://guest:guest@127.0.0.1:{self.amqp_port}/%2f"
            self._write_config()
            try:
                self._spawn_and_wait()
                self._wait_stream_port()
                return
            except BrokerUnavailable as exc:
                if attempt < 2 and "eaddrinuse" in str(exc).lower():
                    log.info(
                        "port clash while booting %s, retrying with other ports", self.node_name
                    )
                    continue
                raise

    def _wait_stream_port(self) -> None:
        """With streams: until the stream listener accepts connections (the plugin may
        start after the AMQP listener answers)."""
        if self.stream_port is None:
            return
        import socket

        deadline = time.monotonic() + self._boot_timeout
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.stream_port), timeout=2).close()
                return
            except OSError as exc:
                if time.monotonic() > deadline:
                    raise BrokerUnavailable(
                        f"the throwaway RabbitMQ node {self.node_name} did not listen for "
                        f"streams on port {self.stream_port} ({exc})\n{self._log_tails()}"
                    ) from None
                time.sleep(0.2)

    def _spawn(self) -> None:
        kwargs: dict[str, Any] = {}
        run_as = self._run_as()
        if run_as is not None:
            kwargs.update(user=run_as[0], group=run_as[1], extra_groups=[])
        with open(self._path("log", "console.log"), "ab") as console:
            self._proc = subprocess.Popen(
                self._server_argv(),
                env=self._env(),
                cwd=self._base,
                stdin=subprocess.DEVNULL,
                stdout=console,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                **kwargs,
            )

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
        count_run("node boots", "", self.boot_seconds, 0.0)
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
                unregister_broker(self)
                shutil.rmtree(self._base, ignore_errors=True)

    # -- rabbitmqctl / erl_call -------------------------------------------------------

    def ctl(self, *args: str, timeout: float = 60.0) -> str:
        res = run_command(
            self._ctl_argv(*args),
            what="rabbitmqctl",
            timeout=timeout,
            env=self._env(),
            cwd=self._base,
            user=self._run_as(),
        )
        return check_command(res, "rabbitmqctl", args)

    def _erl_eval(self, expr: str) -> str | None:
        cmd = self._erl_call_argv()
        if cmd is None or not self.is_running():
            return None
        try:
            res = run_command(
                cmd,
                what="erl_call",
                timeout=15,
                env=self._env(),
                cwd=self._base,
                user=self._run_as(),
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
        super().close_connections(reason)  # erl_call, else rabbitmqctl
