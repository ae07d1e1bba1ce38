"""A throwaway RabbitMQ 4.x node of the kit's own, run inside a Debian root.

The root (:func:`._rootfs.ensure_root`) holds the newer broker and Erlang; the
node runs there with ``chroot``, beside the machine's own RabbitMQ, sharing its
network: every port is its own (AMQP, Erlang distribution, and an epmd of its
own on ``ERL_EPMD_PORT``) and bound to 127.0.0.1 only.

Mounts: the node starts in a private mount namespace (``unshare --mount``) in
which /proc is mounted into the root; the mount is invisible outside and
disappears with the node's last process, so nothing is left mounted on the host,
even after a SIGKILL. The root's /dev holds the device nodes debootstrap made
(null, zero, random, urandom, ...); the host's /dev is never bind-mounted.

rabbitmqctl and erl_call run inside the root (``chroot --userspec``) with the
node's HOME (and so its cookie) and epmd port. Everything else (data directory,
boot, stop, kill, counts) is the machine-node provider's (:mod:`._provider_node`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import pathlib
import shutil
import socket
import subprocess
import time
from collections.abc import Callable

from ackkit.testing import BrokerUnavailable, NodeTLS
from ackkit.testing.providers import free_port

from ._provider_node import _OwnNode
from ._rootfs import _pdeathsig, ensure_root, root_version

log = logging.getLogger("ackkit.testing")

_BIN = "/usr/lib/rabbitmq/bin"  # the real scripts in Debian's package (not the su-wrapper)
_MOUNT_AND_ENTER = 'mount -t proc proc "$1/proc" && shift && exec chroot "$@"'


def _chroot_user(root: pathlib.Path, name: str = "rabbitmq") -> tuple[int, int]:
    """(uid, gid) of ``name`` in the root's own /etc/passwd."""
    with open(root / "etc/passwd", encoding="utf-8") as fh:
        for line in fh:
            fields = line.strip().split(":")
            if len(fields) >= 4 and fields[0] == name:
                return int(fields[2]), int(fields[3])
    raise BrokerUnavailable(f"the root {root} has no user {name!r} (is rabbitmq-server there?)")


class _ChrootNode(_OwnNode):
    """A throwaway node of RabbitMQ ``version`` inside the Debian root of that version."""

    def __init__(
        self,
        version: str,
        *,
        reap_orphans: Callable[[str], None],
        boot_timeout: float | None = None,
        tls: NodeTLS | None = None,
        root: pathlib.Path | None = None,
        streams: bool = False,
        epmd_port: int | None = None,
        cookie: str | None = None,
        more_config: str = "",
        advanced_config: str = "",
        name_tag: str = "",
    ) -> None:
        """``epmd_port``: an epmd somebody else runs (a cluster's nodes share one, so
        that they find each other); by default the node runs an epmd of its own.
        ``cookie``, ``more_config``, ``advanced_config``, ``name_tag``: as for
        :class:`._provider_node._OwnNode`."""
        if os.geteuid() != 0:
            raise BrokerUnavailable(
                f"a RabbitMQ {version} node of the kit's own runs in a Debian root with chroot, "
                "which needs root; run the tests as root, or set AMQP_URL to a "
                f"RabbitMQ {version} broker, or start a Docker engine"
            )
        for tool in ("unshare", "chroot", "mount"):
            if shutil.which(tool, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin") is None:
                raise BrokerUnavailable(f"a node in a Debian root needs {tool} (util-linux)")
        self._root = root if root is not None else ensure_root(version)
        self.rabbitmq_version = root_version(self._root) or version
        self._epmd_port = epmd_port or 0
        self._shared_epmd = epmd_port is not None
        self._epmd: subprocess.Popen[bytes] | None = None
        super().__init__(
            f"{_BIN}/rabbitmq-server",
            reap_orphans=reap_orphans,
            boot_timeout=boot_timeout,
            tls=tls,
            streams=streams,
            cookie=cookie,
            more_config=more_config,
            advanced_config=advanced_config,
            name_tag=name_tag,
        )

    # -- where things are ----------------------------------------------------------

    def _data_parent(self) -> str:
        return str(self._root / "tmp")

    def _inner(self, *parts: str) -> str:
        rel = os.path.relpath(self._base, self._root)
        return os.path.join("/", rel, *parts)

    def _node_owner(self) -> tuple[int, int] | None:
        return _chroot_user(self._root)

    def _run_as(self) -> tuple[int, int] | None:
        return None  # chroot needs root; it drops to the node's user itself

    def _userspec(self) -> str:
        assert self._user is not None
        return f"--userspec={self._user[0]}:{self._user[1]}"

    # -- programs --------------------------------------------------------------------

    def _env(self) -> dict[str, str]:
        env = super()._env()
        env["ERL_EPMD_PORT"] = str(self._epmd_port)
        env["ERL_EPMD_ADDRESS"] = "127.0.0.1"
        env["PATH"] = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
        return env

    def _spawn(self) -> None:
        self._ensure_epmd()
        super()._spawn()

    def _server_argv(self) -> list[str]:
        return [
            "unshare", "--mount", "--propagation", "private",
            "sh", "-c", _MOUNT_AND_ENTER, "ackkit-node",
            str(self._root), self._userspec(), str(self._root), self._server,
        ]  # fmt: skip

    def _ctl_argv(self, *args: str) -> list[str]:
        ctl = f"{_BIN}/rabbitmqctl"
        return ["chroot", self._userspec(), str(self._root), ctl, "-n", str(self.node_name), *args]

    def _erl_call_argv(self) -> list[str] | None:
        return [
            "chroot", self._userspec(), str(self._root), "/usr/bin/erl_call",
            "-sname", str(self.node_name), "-timeout", "10", "-e",
        ]  # fmt: skip

    # -- epmd ------------------------------------------------------------------------

    def _ensure_epmd(self) -> None:
        """An epmd of the node's own (started once, kept over restarts, ended on close),
        unless the node was given a shared one."""
        if self._shared_epmd or (self._epmd is not None and self._epmd.poll() is None):
            return
        if not self._epmd_port:
            self._epmd_port = free_port(avoid=frozenset({self.amqp_port, self._dist_port}))
        self._epmd = start_epmd(self._root, self._epmd_port, what=f"node {self.node_name}")

    def _stop_epmd(self) -> None:
        proc, self._epmd = self._epmd, None
        if proc is not None and proc.poll() is None:
            proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(5)

    def _boot_with_port_retry(self) -> None:
        try:
            super()._boot_with_port_retry()
        except BaseException:
            self._stop_epmd()
            raise

    def close(self) -> None:
        try:
            super().close()
        finally:
            self._stop_epmd()

    def __repr__(self) -> str:
        return super().__repr__()[:-1] + f" rabbitmq={self.rabbitmq_version}>"


def start_epmd(root: pathlib.Path, port: int, *, what: str) -> subprocess.Popen[bytes]:
    """An epmd from ``root`` listening on 127.0.0.1:``port``, once it listens.

    It runs in the foreground as the kit's child and dies with the kit's process
    (PR_SET_PDEATHSIG) if that is killed; the caller kills it when done.
    """
    argv = ["chroot", str(root), "/usr/bin/epmd", "-port", str(port)]
    proc = subprocess.Popen(
        [*argv, "-address", "127.0.0.1"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        preexec_fn=_pdeathsig,
    )
    # The node must find it listening, or it starts an epmd of its own.
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and proc.poll() is None:
        with (
            contextlib.suppress(OSError),
            socket.create_connection(("127.0.0.1", port), timeout=1),
        ):
            return proc
        time.sleep(0.02)
    proc.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(5)
    raise BrokerUnavailable(f"the epmd of {what} did not listen on 127.0.0.1:{port}")
