"""Small helpers shared by the test kit: URL masking, ports, process liveness, AMQP probe."""

from __future__ import annotations

import contextlib
import errno
import os
import random
import socket
import urllib.parse

from .._connection.url import mask_url as _mask_url

__all__ = [
    "free_port",
    "is_local_host",
    "mask_secrets",
    "mask_url",
    "pid_alive",
]


def mask_url(url: str) -> str:
    """Return ``url`` with the password replaced by ``***``.

    ``amqp://guest:guest@host:5672/%2f`` -> ``amqp://guest:***@host:5672/%2f``.
    URLs without a password come back unchanged.
    """
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return mask_secrets(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.hostname or ""
    if ":" in host:  # IPv6 literal
        host = f"[{host}]"
    try:
        port = parts.port
    except ValueError:
        port = None
    netloc = f"{user}:***@{host}" + (f":{port}" if port is not None else "")
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


def mask_secrets(text: str) -> str:
    """Mask the password of every ``scheme://user:password@`` URL inside ``text`` (in
    time linear in its length: ackkit's own masking)."""
    return _mask_url(text)


def is_local_host(host: str | None) -> bool:
    """True when ``host`` names this machine (loopback or one of its own names)."""
    if not host:
        return True
    host = host.strip("[]").lower()
    if host in {"localhost", "localhost.localdomain", "::1", "0.0.0.0", "::"}:
        return True
    if host.startswith("127."):
        return True
    names = {socket.gethostname().lower()}
    with contextlib.suppress(OSError):
        names.add(socket.getfqdn().lower())
    return host in names


def _port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_port(low: int = 20000, high: int = 30000, avoid: frozenset[int] = frozenset()) -> int:
    """Pick a currently free TCP port on the loopback interface.

    The range stays below the Linux ephemeral range (32768+) so client sockets do
    not grab it between our check and the broker's bind.
    """
    rng = random.SystemRandom()
    for _ in range(200):
        port = rng.randrange(low, high)
        if port not in avoid and _port_is_free(port) and _port_is_free(port, "0.0.0.0"):
            return port
    raise OSError(errno.EADDRINUSE, f"no free TCP port found in {low}-{high}")


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists (False for pids <= 0)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie still answers kill(0); treat it as dead.
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
            fields = fh.read().rsplit(")", 1)[-1].split()
        return not fields or fields[0] != "Z"
    except OSError:
        return True


def amqp_greets(host: str, port: int, timeout: float) -> bool:
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
