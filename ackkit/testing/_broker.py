"""Provisioning of a real RabbitMQ broker for tests.

Order (see ``provision_broker``):

1. ``AMQP_URL`` is set: use that broker (``own=False``).
2. A Docker engine answers: a testcontainers RabbitMQ container (``own=True``).
3. A ``rabbitmq-server`` binary is installed: a throwaway node of the kit's own,
   with its own data directory, ports, node name and Erlang cookie (``own=True``).
4. Otherwise :class:`BrokerUnavailable` says how to get a broker.

``ACKKIT_TEST_BROKER=url|docker|own`` forces one of the ways (``auto`` is the default).

Only the standard library is imported at module level; pika, docker and
testcontainers are imported when they are needed.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import glob
import importlib
import json
import logging
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import warnings
from collections.abc import Iterator, Sequence
from types import TracebackType
from typing import Any, TypeVar

from ._util import (
    free_port,
    is_local_host,
    iter_processes,
    kill_pid,
    mask_secrets,
    mask_url,
    pid_alive,
    tail,
)

__all__ = [
    "ENV_MODE",
    "ENV_URL",
    "BrokerError",
    "BrokerHandle",
    "BrokerNotOwned",
    "BrokerUnavailable",
    "NodeTLS",
    "QueueCounts",
    "QueueNotFound",
    "provision_broker",
]

log = logging.getLogger("ackkit.testing")

ENV_URL = "AMQP_URL"
ENV_MODE = "ACKKIT_TEST_BROKER"  # auto | url | docker | own
ENV_IMAGE = "ACKKIT_TEST_RABBITMQ_IMAGE"  # docker image, default below
ENV_SERVER = "ACKKIT_RABBITMQ_SERVER"  # explicit path of the rabbitmq-server script
ENV_NODE = "ACKKIT_TEST_NODE"  # node name rabbitmqctl should use for AMQP_URL brokers
ENV_NODE_USER = "ACKKIT_TEST_NODE_USER"  # user an own node runs as when we are root
ENV_NODE_DIR = "ACKKIT_TEST_NODE_DIR"  # parent directory of own nodes' data directories
ENV_BOOT_TIMEOUT = "ACKKIT_TEST_BOOT_TIMEOUT"  # seconds, default 60

DEFAULT_IMAGE = "rabbitmq:3.13"
MODES = ("auto", "url", "docker", "own")

_SBIN_DIRS = (
    "/usr/sbin",
    "/usr/local/sbin",
    "/sbin",
    "/opt/homebrew/sbin",
    "/usr/lib/rabbitmq/bin",
)

HOW_TO_GET_A_BROKER = """\
How to get a broker for the tests (any one of):
  * point the tests at a running broker:  export AMQP_URL=amqp://guest:guest@127.0.0.1:5672/%2f
  * start a Docker engine (the kit then runs the rabbitmq image through testcontainers)
  * install the RabbitMQ server so the kit can start a throwaway node of its own:
        sudo apt-get update && sudo apt-get install -y rabbitmq-server   (Debian/Ubuntu)
        brew install rabbitmq                                           (macOS)
Force one way with ACKKIT_TEST_BROKER=url|docker|own."""

_H = TypeVar("_H", bound="BrokerHandle")


class BrokerUnavailable(RuntimeError):
    """No broker could be provisioned; the message says why and how to get one."""


class BrokerError(RuntimeError):
    """A broker operation (rabbitmqctl, restart, ...) failed."""


class BrokerNotOwned(BrokerError):
    """The operation needs a node the kit started (restart/stop/start/kill)."""


class QueueNotFound(BrokerError):
    """``counts()``/``purge()`` on a queue that does not exist."""


@dataclasses.dataclass(frozen=True)
class QueueCounts:
    """Message counts of one queue, as the broker reports them right now."""

    ready: int
    unacked: int
    total: int
    consumers: int


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


# --------------------------------------------------------------------------- helpers


def _env_float(name: str, default: float) -> float:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        return float(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a number") from None


def _erl_binary(text: str) -> str:
    """An Erlang binary literal for ``text`` that needs no escaping: <<104,105>>."""
    return "<<" + ",".join(str(b) for b in text.encode("utf-8")) + ">>"


def _run(
    cmd: Sequence[str],
    *,
    what: str,
    timeout: float,
    env: dict[str, str] | None = None,
    cwd: str | None = None,
    user: tuple[int, int] | None = None,
    input_text: str | None = None,
) -> subprocess.CompletedProcess[str]:
    kwargs: dict[str, Any] = {}
    if user is not None:
        kwargs.update(user=user[0], group=user[1], extra_groups=[])
    try:
        return subprocess.run(
            list(cmd),
            input=input_text,
            capture_output=True,
            text=True,
            env=env,
            cwd=cwd,
            timeout=timeout,
            check=False,
            **kwargs,
        )
    except subprocess.TimeoutExpired as exc:
        raise BrokerError(
            f"{what} timed out after {timeout:.0f}s: {mask_secrets(' '.join(cmd))}"
        ) from exc
    except OSError as exc:
        raise BrokerError(f"{what} could not be run ({exc}): {cmd[0]}") from exc


def _check(res: subprocess.CompletedProcess[str], what: str, args: Sequence[str]) -> str:
    if res.returncode != 0:
        output = (res.stdout + "\n" + res.stderr).strip()
        raise BrokerError(
            f"{what} {' '.join(args)} failed with exit code {res.returncode}:\n"
            + mask_secrets(output[-4000:])
        )
    return res.stdout


def _parse_list_queues_json(text: str) -> dict[str, QueueCounts]:
    text = text.strip()
    start = text.find("[")
    if start < 0:
        raise BrokerError(f"unexpected list_queues output: {text[:500]!r}")
    try:
        rows = json.loads(text[start:])
    except ValueError as exc:
        raise BrokerError(f"unexpected list_queues output: {text[:500]!r}") from exc
    result: dict[str, QueueCounts] = {}
    for row in rows:
        name = str(row["name"])
        values = [
            row.get(k)
            for k in ("messages_ready", "messages_unacknowledged", "messages", "consumers")
        ]
        if not all(isinstance(v, int) for v in values):
            raise BrokerError(f"queue {name!r} has no counts (is it down?): {row}")
        result[name] = QueueCounts(*(int(v) for v in values))
    return result


def _amqp_greets(host: str, port: int, timeout: float) -> bool:
    """True when the server answers the AMQP 0-9-1 header with connection.start.

    A cheap probe that does not log anything: a node that is still booting
    accepts TCP connections and resets them, which pika would log as errors.
    """
    try:
        with socket.create_connection((host, port), timeout=min(timeout, 2.0)) as sock:
            sock.settimeout(timeout)
            sock.sendall(b"AMQP\x00\x00\x09\x01")
            data = b""
            while len(data) < 11:
                chunk = sock.recv(11 - len(data))
                if not chunk:
                    return False
                data += chunk
    except OSError:
        return False
    # frame type 1 (method), channel 0, size; class 10 (connection), method 10 (start)
    return data[0] == 1 and data[7:11] == b"\x00\x0a\x00\x0a"


def _pika() -> Any:
    import pika

    return pika


# --------------------------------------------------------------------------- handle


class BrokerHandle:
    """A provisioned broker. Use :func:`provision_broker` to get one.

    Attributes: ``url`` (amqp URL), ``own`` (True when the kit started the node,
    so restart/stop/start/kill are allowed), ``amqp_port``, ``node_name`` (None
    when unknown), ``vhost``, ``kind`` ("url", "docker" or "own").
    """

    kind = "?"

    def __init__(
        self,
        url: str,
        *,
        own: bool,
        amqp_port: int,
        node_name: str | None,
        vhost: str = "/",
    ) -> None:
        self._url = url
        self.own = own
        self.amqp_port = amqp_port
        self.node_name = node_name
        self.vhost = vhost
        self._closed = False

    # -- identity ---------------------------------------------------------------

    @property
    def url(self) -> str:
        return self._url

    @property
    def masked_url(self) -> str:
        return mask_url(self._url)

    def __repr__(self) -> str:
        return (
            f"<{type(self).__name__} kind={self.kind} url={self.masked_url} "
            f"node={self.node_name} own={self.own}>"
        )

    __str__ = __repr__

    # -- lifetime ---------------------------------------------------------------

    def __enter__(self: _H) -> _H:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Release the broker (stop and remove a node or container the kit started)."""
        self._closed = True

    @property
    def closed(self) -> bool:
        return self._closed

    # -- AMQP -------------------------------------------------------------------

    def connection_parameters(self, **overrides: Any) -> Any:
        """``pika.URLParameters`` for this broker; keyword arguments override fields."""
        params = _pika().URLParameters(self._url)
        for key, value in overrides.items():
            setattr(params, key, value)
        return params

    def connect(self, **overrides: Any) -> Any:
        """A new ``pika.BlockingConnection``; the caller closes it."""
        return _pika().BlockingConnection(self.connection_parameters(**overrides))

    def ping(self, timeout: float = 5.0) -> bool:
        """True when an AMQP connection (handshake and login) succeeds."""
        parts = urllib.parse.urlsplit(self._url)
        if parts.scheme == "amqp" and not _amqp_greets(
            parts.hostname or "localhost", self.amqp_port, timeout
        ):
            return False
        pika = _pika()
        try:
            conn = pika.BlockingConnection(
                self.connection_parameters(
                    connection_attempts=1,
                    retry_delay=0,
                    socket_timeout=timeout,
                    stack_timeout=timeout,
                    blocked_connection_timeout=timeout,
                )
            )
        except (pika.exceptions.AMQPError, OSError):
            return False
        with contextlib.suppress(Exception):
            conn.close()
        return True

    def wait_until_up(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while not self.ping(timeout=5.0):
            if time.monotonic() > deadline:
                raise BrokerError(f"{self.masked_url} did not answer AMQP within {timeout:.0f}s")
            time.sleep(0.1)

    @contextlib.contextmanager
    def _channel(self) -> Iterator[Any]:
        conn = self.connect(
            connection_attempts=1, retry_delay=0, socket_timeout=10, stack_timeout=15
        )
        try:
            yield conn.channel()
        finally:
            with contextlib.suppress(Exception):
                conn.close()

    def purge(self, queue: str) -> int:
        """Remove all ready messages of ``queue``; returns how many were removed."""
        pika = _pika()
        try:
            with self._channel() as ch:
                ok = ch.queue_purge(queue)
        except pika.exceptions.ChannelClosedByBroker as exc:
            if exc.reply_code == 404:
                raise QueueNotFound(
                    f"queue {queue!r} does not exist (vhost {self.vhost!r})"
                ) from exc
            raise
        return int(ok.method.message_count)

    def delete(self, queue: str, *, if_unused: bool = False, if_empty: bool = False) -> None:
        """Delete ``queue`` (no error when it does not exist)."""
        self.delete_many([queue], if_unused=if_unused, if_empty=if_empty)

    def delete_many(
        self,
        queues: Sequence[str] = (),
        exchanges: Sequence[str] = (),
        *,
        if_unused: bool = False,
        if_empty: bool = False,
    ) -> None:
        """Delete several queues and exchanges over one connection."""
        if not queues and not exchanges:
            return
        pika = _pika()
        with self._channel() as ch:
            for name in queues:
                try:
                    ch.queue_delete(name, if_unused=if_unused, if_empty=if_empty)
                except pika.exceptions.ChannelClosedByBroker as exc:
                    if exc.reply_code != 404:
                        raise
                    ch = ch.connection.channel()
            for name in exchanges:
                if not name or name.startswith("amq."):
                    continue
                try:
                    ch.exchange_delete(name)
                except pika.exceptions.ChannelClosedByBroker as exc:
                    if exc.reply_code != 404:
                        raise
                    ch = ch.connection.channel()

    # -- counts -----------------------------------------------------------------

    def _erl_eval(self, expr: str) -> str | None:
        """Evaluate ``expr`` on the node (fast path); None when not available."""
        return None

    def counts(self, queue: str) -> QueueCounts:
        """Exact counts of ``queue`` right now (ready, unacked, total, consumers)."""
        expr = (
            "R = try case rabbit_amqqueue:lookup(rabbit_misc:r("
            f"{_erl_binary(self.vhost)}, queue, {_erl_binary(queue)})) of "
            "{ok, Q} -> I = rabbit_amqqueue:info(Q, [messages_ready, messages_unacknowledged, "
            "messages, consumers]), "
            'io_lib:format("~w,~w,~w,~w", [proplists:get_value(K, I) || K <- '
            "[messages_ready, messages_unacknowledged, messages, consumers]]); "
            '_ -> "missing" end catch _:_ -> "error" end, '
            'lists:flatten(["OK;", R]).'
        )
        out = self._erl_eval(expr)
        if out == "missing":
            raise QueueNotFound(f"queue {queue!r} does not exist (vhost {self.vhost!r})")
        if out is not None:
            parts = out.split(",")
            if len(parts) == 4 and all(p.isdigit() for p in parts):
                return QueueCounts(*(int(p) for p in parts))
        table = self._ctl_counts()
        if queue not in table:
            raise QueueNotFound(f"queue {queue!r} does not exist (vhost {self.vhost!r})")
        return table[queue]

    def counts_all(self) -> dict[str, QueueCounts]:
        """Counts of every queue of the vhost."""
        expr = (
            "L = rabbit_amqqueue:info_all("
            f"{_erl_binary(self.vhost)}, [name, messages_ready, messages_unacknowledged, "
            "messages, consumers]), "
            'lists:flatten(["OK;" | [[[io_lib:format("~2.16.0b", [B]) || '
            "<<B>> <= element(4, proplists:get_value(name, I))], "
            'io_lib:format(",~w,~w,~w,~w;", [proplists:get_value(K, I) || K <- '
            "[messages_ready, messages_unacknowledged, messages, consumers]])] || I <- L]])."
        )
        out = self._erl_eval(expr)
        if out is not None:
            try:
                result: dict[str, QueueCounts] = {}
                for item in filter(None, out.split(";")):
                    hexname, *values = item.split(",")
                    name = bytes.fromhex(hexname).decode("utf-8")
                    result[name] = QueueCounts(*(int(v) for v in values))
                return result
            except (ValueError, TypeError):
                log.debug("fast counts_all output not understood: %r", out[:300])
        return self._ctl_counts()

    def queue_names(self) -> list[str]:
        return sorted(self.counts_all())

    def exchange_names(self) -> list[str]:
        """Names of the exchanges of the vhost (including the default '' and amq.*)."""
        expr = (
            'lists:flatten(["OK;" | [[[io_lib:format("~2.16.0b", [B]) || '
            '<<B>> <= element(4, element(2, X))], ";"] || X <- rabbit_exchange:list('
            f"{_erl_binary(self.vhost)})]])."
        )
        out = self._erl_eval(expr)
        if out is not None:
            try:
                return sorted(bytes.fromhex(h).decode("utf-8") for h in out.split(";") if h)
            except ValueError:
                log.debug("fast exchange_names output not understood: %r", out[:300])
        text = self.ctl(
            "list_exchanges", "-p", self.vhost, "--formatter", "json", "--quiet", "name"
        )
        start = text.find("[")
        try:
            rows = json.loads(text[start:]) if start >= 0 else []
        except ValueError as exc:
            raise BrokerError(f"unexpected list_exchanges output: {text[:500]!r}") from exc
        return sorted(str(r["name"]) for r in rows)

    def _ctl_counts(self) -> dict[str, QueueCounts]:
        text = self.ctl(
            "list_queues",
            "-p",
            self.vhost,
            "--formatter",
            "json",
            "--quiet",
            "name",
            "messages_ready",
            "messages_unacknowledged",
            "messages",
            "consumers",
        )
        return _parse_list_queues_json(text)

    def wait_for(
        self,
        queue: str,
        *,
        ready: int | None = None,
        unacked: int | None = None,
        total: int | None = None,
        consumers: int | None = None,
        timeout: float = 10.0,
        interval: float = 0.05,
    ) -> QueueCounts:
        """Poll ``counts(queue)`` until the given fields match; AssertionError on timeout.

        Acks and publishes reach the queue asynchronously, so a test should wait
        for the expected state rather than read counts once.
        """
        want = {"ready": ready, "unacked": unacked, "total": total, "consumers": consumers}
        want = {k: v for k, v in want.items() if v is not None}
        deadline = time.monotonic() + timeout
        last: QueueCounts | str = "no answer yet"
        while True:
            try:
                last = self.counts(queue)
                if all(getattr(last, k) == v for k, v in want.items()):
                    return last
            except QueueNotFound as exc:
                last = str(exc)
            if time.monotonic() >= deadline:
                raise AssertionError(
                    f"queue {queue!r} did not reach {want} within {timeout:.1f}s; last: {last}"
                )
            time.sleep(interval)

    # -- control ----------------------------------------------------------------

    def ctl(self, *args: str, timeout: float = 60.0) -> str:
        """Run ``rabbitmqctl <args>`` against this broker's node; returns stdout."""
        raise BrokerError(f"rabbitmqctl is not available for {self!r}")

    def close_connections(self, reason: str = "closed by the ackkit test kit") -> None:
        """Force-close every client connection of the node (or vhost for AMQP_URL brokers)."""
        self.ctl("close_all_connections", "--global", reason)

    def _not_owned(self, op: str) -> BrokerNotOwned:
        return BrokerNotOwned(
            f"{op}() needs a broker node the test kit started itself (own=True); {self!r} is "
            f"an external broker. Use the own_rabbitmq fixture, or unset {ENV_URL} so the kit "
            "provisions its own node."
        )

    def restart(self) -> None:
        """Stop and start the node; returns once AMQP answers again."""
        raise self._not_owned("restart")

    def stop(self) -> None:
        raise self._not_owned("stop")

    def start(self) -> None:
        raise self._not_owned("start")

    def kill(self, *, flush_metadata: bool = True) -> None:
        """Kill the node without a clean shutdown (SIGKILL); ``start()`` brings it back.

        RabbitMQ 3.x writes queue/exchange declarations to Mnesia's transaction
        log asynchronously: a SIGKILL soon after ``queue.declare-ok`` can lose the
        queue (seen in about 1 of 5 kills under disk load). With ``flush_metadata``
        (the default) the log is synced first (``mnesia:sync_log()``), so a test
        sees a crash of the message path with the topology intact; messages get
        no such help (only confirmed persistent ones survive). Pass
        ``flush_metadata=False`` for a crash with nothing flushed.
        """
        raise self._not_owned("kill")

    def _sync_metadata(self) -> None:
        if self._erl_eval('mnesia:sync_log(), "OK;".') is None:
            with contextlib.suppress(BrokerError):
                self.ctl("eval", "mnesia:sync_log().")

    def is_running(self) -> bool:
        return self.ping()

    @property
    def amqps_url(self) -> str | None:
        """``amqps://`` URL of a TLS listener (``provision_broker(tls=...)``), else None."""
        return None

    def log_text(self) -> str | None:
        """The broker's own log so far (to scan it for errors); None when not reachable."""
        return None


# --------------------------------------------------------------------------- AMQP_URL


class _UrlBroker(BrokerHandle):
    kind = "url"

    def __init__(self, url: str, *, check: bool = True) -> None:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("amqp", "amqps"):
            raise BrokerUnavailable(f"{ENV_URL}={mask_url(url)} is not an amqp:// or amqps:// URL")
        try:
            port = parts.port or (5671 if parts.scheme == "amqps" else 5672)
        except ValueError as exc:
            raise BrokerUnavailable(f"{ENV_URL}={mask_url(url)}: bad port") from exc
        vhost = urllib.parse.unquote(parts.path[1:]) if len(parts.path) > 1 else "/"
        super().__init__(
            url,
            own=False,
            amqp_port=port,
            node_name=os.environ.get(ENV_NODE) or None,
            vhost=vhost,
        )
        self._host = parts.hostname or "localhost"
        self._local = is_local_host(self._host)
        self._node_checked = False
        if check and not self.ping(timeout=10.0):
            raise BrokerUnavailable(
                f"{ENV_URL}={self.masked_url} does not answer AMQP (connection or login failed). "
                f"Start that broker or unset {ENV_URL}.\n{HOW_TO_GET_A_BROKER}"
            )

    def _ctl_path(self) -> str:
        if not self._local and not self.node_name:
            raise BrokerError(
                f"counts() and ctl() need rabbitmqctl access to the node, but the broker of "
                f"{ENV_URL}={self.masked_url} is not on this machine. Set {ENV_NODE}=<node@host> "
                f"(with the node's Erlang cookie in ~/.erlang.cookie), or unset {ENV_URL} so the "
                "kit starts a broker of its own."
            )
        path = os.pathsep.join([os.environ.get("PATH", ""), *_SBIN_DIRS])
        found = shutil.which("rabbitmqctl", path=path)
        if not found:
            raise BrokerError(
                f"counts() and ctl() for {ENV_URL}={self.masked_url} need rabbitmqctl, which is "
                "not installed (apt-get install -y rabbitmq-server provides it)."
            )
        return found

    def ctl(self, *args: str, timeout: float = 60.0) -> str:
        exe = self._ctl_path()
        cmd = [exe, *(["-n", self.node_name] if self.node_name else []), *args]
        res = _run(cmd, what="rabbitmqctl", timeout=timeout, cwd=tempfile.gettempdir())
        return _check(res, "rabbitmqctl", args)

    def _ctl_counts(self) -> dict[str, QueueCounts]:
        if not self._node_checked:
            self._check_node_serves_url()
        return super()._ctl_counts()

    def _check_node_serves_url(self) -> None:
        """Make sure the node rabbitmqctl talks to is the broker of AMQP_URL."""
        text = self.ctl("status", "--formatter", "json")
        try:
            status = json.loads(text[text.find("{") :])
            ports = {int(x["port"]) for x in status.get("listeners", []) if "amqp" in x["protocol"]}
        except (ValueError, KeyError, TypeError):
            ports = set()
        if ports and self.amqp_port not in ports:
            raise BrokerError(
                f"the local RabbitMQ node rabbitmqctl reaches listens for AMQP on {sorted(ports)}, "
                f"not on port {self.amqp_port} of {ENV_URL}={self.masked_url}; its counts would be "
                f"another broker's. Set {ENV_NODE}=<node name> for that broker."
            )
        self._node_checked = True

    def close_connections(self, reason: str = "closed by the ackkit test kit") -> None:
        self.ctl("close_all_connections", "-p", self.vhost, reason)


# --------------------------------------------------------------------------- Docker


def _docker_engine(timeout: float = 3.0) -> tuple[bool, str]:
    """(True, '') when a Docker engine answers, else (False, why)."""
    host = os.environ.get("DOCKER_HOST", "").strip() or "unix:///var/run/docker.sock"
    if host.startswith("unix://"):
        # Probe the socket ourselves first: the docker SDK leaks an unclosed socket
        # (a ResourceWarning) when nothing listens, and this is the common case.
        path = host[len("unix://") :]
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(timeout)
                sock.connect(path)
        except OSError as exc:
            return False, f"no Docker engine answers on {host} ({exc.strerror or exc})"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            docker: Any = importlib.import_module("docker")
    except ImportError:
        return False, "the docker Python package is not installed"
    client = None
    try:
        client = docker.from_env(timeout=int(max(1, timeout)))
        client.ping()
    except Exception as exc:
        return False, f"no Docker engine answered ({type(exc).__name__}: {str(exc)[:200]})"
    finally:
        if client is not None:
            with contextlib.suppress(Exception):
                client.close()
    return True, ""


def _rabbitmq_container_class() -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            from testcontainers.community.rabbitmq import RabbitMqContainer
        except ImportError:
            try:
                from testcontainers.rabbitmq import RabbitMqContainer
            except ImportError as exc:
                raise BrokerUnavailable(
                    "a Docker engine answers but testcontainers is not installed "
                    "(pip install 'testcontainers>=4')"
                ) from exc
    return RabbitMqContainer


class _DockerBroker(BrokerHandle):
    """A RabbitMQ container started through testcontainers.

    ``stop()``/``start()``/``restart()`` stop and start the RabbitMQ application
    inside the container (rabbitmqctl stop_app/start_app), so the mapped port
    stays the same. ``kill()`` kills the container and starts it again; Docker
    may map a different host port then, so read ``url`` again after ``kill()``.
    """

    kind = "docker"

    def __init__(self, image: str) -> None:
        cls = _rabbitmq_container_class()
        self._container = cls(image)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                self._container.start()
        except Exception as exc:
            with contextlib.suppress(Exception):
                self._container.stop()
            raise BrokerUnavailable(
                f"a Docker engine answers but the RabbitMQ container ({image}) did not start: "
                f"{mask_secrets(str(exc))[:2000]}\n(set {ENV_IMAGE} to use another image, or "
                f"{ENV_MODE}=own to use a local rabbitmq-server instead)"
            ) from exc
        super().__init__(self._container_url(), own=True, amqp_port=0, node_name=None)
        self._refresh()
        _register(self)

    def _container_url(self) -> str:
        c = self._container
        host = c.get_container_host_ip()
        port = int(c.get_exposed_port(c.port))
        user = urllib.parse.quote(c.username, safe="")
        password = urllib.parse.quote(c.password, safe="")
        vhost = urllib.parse.quote(c.vhost, safe="")
        return f"amqp://{user}:{password}@{host}:{port}/{vhost}"

    def _refresh(self) -> None:
        self._url = self._container_url()
        self.amqp_port = int(urllib.parse.urlsplit(self._url).port or 5672)

    def ctl(self, *args: str, timeout: float = 60.0) -> str:
        code, output = self._container.exec(["rabbitmqctl", *args])
        text = output.decode("utf-8", "replace") if isinstance(output, bytes) else str(output)
        if code != 0:
            raise BrokerError(
                f"rabbitmqctl {' '.join(args)} in the container failed ({code}):\n{text[-4000:]}"
            )
        return text

    def stop(self) -> None:
        self.ctl("stop_app")

    def start(self) -> None:
        if self.ping():
            return
        self.ctl("start_app")
        self.wait_until_up()

    def restart(self) -> None:
        self.stop()
        self.start()

    def kill(self, *, flush_metadata: bool = True) -> None:
        if flush_metadata:
            self._sync_metadata()
        wrapped = self._container.get_wrapped_container()
        wrapped.kill()
        wrapped.start()
        deadline = time.monotonic() + 60
        while True:
            try:
                wrapped.reload()
                self._refresh()
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        self.wait_until_up()

    def log_text(self) -> str | None:
        try:
            out, err = self._container.get_logs()
        except Exception:
            return None
        return b"".join(x for x in (out, err) if x).decode("utf-8", "replace")

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        _unregister(self)
        with contextlib.suppress(Exception):
            self._container.stop()


# --------------------------------------------------------------------------- own node


def _find_rabbitmq_server() -> str | None:
    """Path of the real ``rabbitmq-server`` script (not the Debian su-wrapper)."""
    explicit = os.environ.get(ENV_SERVER, "").strip()
    if explicit:
        if not os.access(explicit, os.X_OK):
            raise BrokerUnavailable(f"{ENV_SERVER}={explicit} is not an executable file")
        return os.path.realpath(explicit)
    path = os.pathsep.join([os.environ.get("PATH", ""), *_SBIN_DIRS])
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
_reaped = False
_reap_lock = threading.Lock()


def _reap_orphans(parent: str) -> None:
    """Kill nodes (and remove data directories) left behind by dead test runs."""
    global _reaped
    with _reap_lock:
        if _reaped:
            return
        _reaped = True
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


class _OwnNode(BrokerHandle):
    """A throwaway RabbitMQ node: own data dir, ports, node name and Erlang cookie.

    The node runs ``rabbitmq-server`` in the foreground as a child process (as the
    ``rabbitmq`` user when we are root). Its HOME is its data directory, which
    holds a random Erlang cookie; rabbitmqctl and erl_call run with the same HOME
    and user, so they always present the right cookie.
    """

    kind = "own"

    def __init__(
        self, server: str, *, boot_timeout: float | None = None, tls: NodeTLS | None = None
    ) -> None:
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
        _reap_orphans(parent)
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


# --------------------------------------------------------------------------- registry


_live: list[BrokerHandle] = []
_live_lock = threading.Lock()
_atexit_installed = False


def _register(handle: BrokerHandle) -> None:
    global _atexit_installed
    with _live_lock:
        _live.append(handle)
        if not _atexit_installed:
            atexit.register(_close_all)
            _atexit_installed = True


def _unregister(handle: BrokerHandle) -> None:
    with _live_lock, contextlib.suppress(ValueError):
        _live.remove(handle)


def _close_all() -> None:
    with _live_lock:
        handles = list(_live)
    for handle in reversed(handles):
        with contextlib.suppress(Exception):
            handle.close()


# --------------------------------------------------------------------------- entry point


def provision_broker(
    mode: str | None = None, *, exclusive: bool = False, tls: NodeTLS | None = None
) -> BrokerHandle:
    """Provision a real RabbitMQ broker and return its handle.

    The handle is a context manager; leaving it stops whatever the kit started
    (and an atexit hook does the same if a run ends without leaving it).

    ``mode``: "auto" (default, or ``$ACKKIT_TEST_BROKER``), "url", "docker" or "own".
    ``exclusive=True`` asks for a broker the kit owns (docker or own node): ``AMQP_URL``
    is ignored then, and forcing "url" is an error.
    ``tls``: also listen for amqps with these files (a node of the kit's own only;
    its URL is ``handle.amqps_url``).
    """
    if tls is not None:
        if (mode or os.environ.get(ENV_MODE) or "auto").strip().lower() in ("url", "docker"):
            raise BrokerUnavailable("a TLS listener needs a node of the kit's own (mode 'own')")
        server = _find_rabbitmq_server()
        if server is None:
            raise BrokerUnavailable(
                "a TLS listener needs a node of the kit's own, and rabbitmq-server is not "
                "installed.\n" + HOW_TO_GET_A_BROKER
            )
        return _OwnNode(server, tls=tls)
    chosen = (mode or os.environ.get(ENV_MODE) or "auto").strip().lower()
    if chosen not in MODES:
        raise ValueError(f"broker mode must be one of {', '.join(MODES)}, not {chosen!r}")
    url = os.environ.get(ENV_URL, "").strip()
    tried: list[str] = []

    if chosen == "url" or (chosen == "auto" and url and not exclusive):
        if exclusive:
            raise BrokerUnavailable(
                f"a broker node of the test kit's own was requested, but {ENV_MODE}=url forces "
                f"the external broker of {ENV_URL}"
            )
        if not url:
            raise BrokerUnavailable(
                f"{ENV_MODE}=url but {ENV_URL} is not set.\n{HOW_TO_GET_A_BROKER}"
            )
        return _UrlBroker(url)
    tried.append(
        f"{ENV_URL}: " + ("ignored (a broker of the kit's own was asked for)" if url else "not set")
    )

    if chosen in ("auto", "docker"):
        ok, why = _docker_engine()
        if ok:
            return _DockerBroker(os.environ.get(ENV_IMAGE) or DEFAULT_IMAGE)
        if chosen == "docker":
            raise BrokerUnavailable(f"{ENV_MODE}=docker but {why}.\n{HOW_TO_GET_A_BROKER}")
        tried.append(f"Docker: {why}")

    server = _find_rabbitmq_server()
    if server is not None:
        return _OwnNode(server)
    tried.append("rabbitmq-server: not found on PATH or in " + ", ".join(_SBIN_DIRS[:4]))
    raise BrokerUnavailable(
        "no RabbitMQ broker for the tests. Tried:\n  - "
        + "\n  - ".join(tried)
        + "\n"
        + HOW_TO_GET_A_BROKER
    )
