"""A local channel between the foreachBatch wrapper (driver process) and the source runner.

Both run on the driver host, in different processes. The runner listens on a
unix socket whose address both derive from (checkpoint, queue); a request is
one JSON line, the answer one JSON line. The wrapper waits for the answer, so
"written" is acked on the broker before Spark writes its commit log.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger("ackkit.spark")

Handler = Callable[[dict[str, Any]], dict[str, Any]]
MAX_REQUEST = 1 << 16


class RunnerUnreachable(RuntimeError):
    """No source runner answers at the address (not started, dead, or other checkpoint)."""


class IpcServer:
    """Answers requests one at a time on a daemon thread."""

    def __init__(self, address: str, handler: Handler) -> None:
        self.address = address
        self.handler = handler
        self._sock: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._closed = False

    def start(self, bind_timeout: float = 30.0) -> None:
        """Bind (retrying while a previous runner of the same source still holds it)."""
        deadline = time.monotonic() + bind_timeout
        while True:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                stale_file = not self.address.startswith("\0") and os.path.exists(self.address)
                if stale_file and not _answers(self.address):
                    os.unlink(self.address)
                sock.bind(self.address)
                break
            except OSError as exc:
                sock.close()
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        "another rabbitmq source runner for the same checkpoint and queue is "
                        f"still running (cannot listen: {exc})"
                    ) from None
                time.sleep(0.2)
        sock.listen(8)
        self._sock = sock
        self._thread = threading.Thread(target=self._serve, name="ackkit-spark-ipc", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._closed = True
        sock, self._sock = self._sock, None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
            if not self.address.startswith("\0"):
                with contextlib.suppress(OSError):
                    os.unlink(self.address)

    def _serve(self) -> None:
        sock = self._sock
        while sock is not None and not self._closed:
            try:
                conn, _ = sock.accept()
            except OSError:
                return
            with conn:
                try:
                    self._answer(conn)
                except Exception:  # pragma: no cover - a broken client must not kill the server
                    log.exception("ackkit.spark: IPC request failed")

    def _answer(self, conn: socket.socket) -> None:
        data = _read_line(conn)
        try:
            req = json.loads(data)
            reply = self.handler(req)
        except Exception as exc:
            reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        conn.sendall(json.dumps(reply).encode() + b"\n")


def request(address: str, payload: dict[str, Any], timeout: float) -> dict[str, Any]:
    """Send one request and wait for its answer."""
    deadline = time.monotonic() + timeout
    connect_deadline = time.monotonic() + min(timeout, 10.0)
    last: OSError | None = None
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(max(deadline - time.monotonic(), 0.1))
            sock.connect(address)
            sock.sendall(json.dumps(payload).encode() + b"\n")
            return dict(json.loads(_read_line(sock)))
        except (ConnectionRefusedError, FileNotFoundError) as exc:
            last = exc
        finally:
            sock.close()
        if time.monotonic() > connect_deadline:
            break
        time.sleep(0.1)
    raise RunnerUnreachable(str(last))


def _answers(address: str) -> bool:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.settimeout(1.0)
        s.connect(address)
        return True
    except OSError:
        return False
    finally:
        s.close()


def _read_line(sock: socket.socket) -> bytes:
    buf = bytearray()
    while not buf.endswith(b"\n"):
        chunk = sock.recv(65536)
        if not chunk:
            break
        buf += chunk
        if len(buf) > MAX_REQUEST:
            raise ValueError("IPC message too long")
    return bytes(buf)
