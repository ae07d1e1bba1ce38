"""A small TCP proxy between the consumers and the broker that can drop every connection.

`cut()` resets every proxied connection at once (SO_LINGER 0, then close: the
peers see a reset, mid-frame if the stream was busy), as a network failure would.
New connections are accepted again at once. `hold()` stops forwarding what the
broker sends (publisher confirms, deliveries) until `release()` or `cut()`.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading


class Proxy:
    def __init__(self, upstream_port: int, host: str = "127.0.0.1") -> None:
        self.upstream = (host, upstream_port)
        self.listener = socket.create_server((host, 0))
        self.port: int = self.listener.getsockname()[1]
        self.lock = threading.Lock()
        self.pairs: list[tuple[socket.socket, socket.socket]] = []
        self.closed = False
        self.accepted = 0
        self.downstream = threading.Event()  # set: broker -> client bytes flow
        self.downstream.set()
        threading.Thread(target=self._accept, name="chaos-proxy", daemon=True).start()

    def _accept(self) -> None:
        while not self.closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.upstream, timeout=5)
                server.settimeout(None)
            except OSError:
                _reset(client)
                continue
            for s in (client, server):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self.lock:
                self.pairs.append((client, server))
                self.accepted += 1
            for a, b, gate in ((client, server, None), (server, client, self.downstream)):
                threading.Thread(target=self._pump, args=(a, b, gate), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, gate: threading.Event | None) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if gate is not None:
                    gate.wait()
                dst.sendall(data)
        except OSError:
            pass
        self._drop(src, dst)

    def _drop(self, a: socket.socket, b: socket.socket) -> None:
        with self.lock:
            self.pairs = [p for p in self.pairs if a not in p]
        for s in (a, b):
            _reset(s)

    def hold(self) -> None:
        """Stop forwarding broker -> client bytes (the client's frames still go out)."""
        self.downstream.clear()

    def release(self) -> None:
        self.downstream.set()

    def cut(self) -> int:
        """Reset every proxied connection; returns how many there were."""
        with self.lock:
            pairs, self.pairs = self.pairs, []
        for client, server in pairs:
            _reset(client)
            _reset(server)
        self.downstream.set()  # held bytes of the dead connections go nowhere
        return len(pairs)

    def close(self) -> None:
        self.closed = True
        with contextlib.suppress(OSError):
            self.listener.close()
        self.cut()


def _reset(s: socket.socket) -> None:
    with contextlib.suppress(OSError):
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        s.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        s.close()
