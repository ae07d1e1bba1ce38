"""A service that dead-letters three kinds of failure, and a console served in a thread."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

from _retry_support import publish

from ackkit import App, AsyncApp, Consumer, Delivery, Retry

KINDS = {"sku": 7, "price": 5, "gateway": 3}
"""Messages of each kind the service dead-letters."""


def failing_service(app: App | AsyncApp, q: str, fixed: set[str], handled: list[str]) -> None:
    """A listener on `q` failing each kind its own way until the kind is in `fixed`."""

    def handle(d: Delivery) -> None:
        kind, i = json.loads(d.body)["kind"], json.loads(d.body)["i"]
        if kind not in fixed:
            if kind == "sku":
                raise KeyError(f"sku-{i}")
            if kind == "price":
                raise ValueError(f"bad price {i * 7}.{i} for order {1000 + i}")
            raise TimeoutError(f"payment gateway timed out after {100 + i} ms")
        handled.append(str(d.message_id))

    retry = Retry(max_attempts=2, initial_interval=0.05)
    if isinstance(app, App):
        app.listener(q, retry=retry, consumer=Consumer(prefetch=50))(handle)
    else:

        async def ahandle(d: Delivery) -> None:
            handle(d)

        ahandle.__name__ = "handle"
        app.listener(q, retry=retry, consumer=Consumer(prefetch=50))(ahandle)


def publish_kinds(url: str, q: str) -> None:
    for kind, n in KINDS.items():
        for i in range(n):
            body = json.dumps({"kind": kind, "i": i})
            publish(url, q, body, message_id=f"{kind}-{i}", content_type="application/json")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def served(holder: Any, access: Any = None) -> Iterator[str]:
    """The console's app served by uvicorn on a free loopback port, in a thread."""
    import uvicorn

    from ackkit.console import create_app

    port = free_port()
    config = uvicorn.Config(
        create_app(holder, access), host="127.0.0.1", port=port, log_level="warning"
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the console's server did not start")
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(20)


@contextlib.contextmanager
def slow_broker(url: str, delay: float) -> Iterator[str]:
    """`url` through a loopback TCP proxy that holds each new connection `delay` seconds
    before it connects on to the broker (a broker slow to answer, as under load)."""
    import urllib.parse

    parts = urllib.parse.urlsplit(url)
    upstream = (parts.hostname or "127.0.0.1", parts.port or 5672)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    stop = threading.Event()

    def pump(src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                dst.sendall(data)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)

    def relay(client: socket.socket) -> None:
        if stop.wait(delay):
            client.close()
            return
        try:
            broker = socket.create_connection(upstream, timeout=10)
        except OSError:
            client.close()
            return
        broker.settimeout(None)
        back = threading.Thread(target=pump, args=(broker, client), daemon=True)
        back.start()
        pump(client, broker)
        back.join(30)
        client.close()
        broker.close()

    def accept() -> None:
        with contextlib.suppress(OSError):
            while not stop.is_set():
                client, _ = listener.accept()
                threading.Thread(target=relay, args=(client,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    netloc = parts.netloc.rsplit("@", 1)
    host = f"127.0.0.1:{listener.getsockname()[1]}"
    proxied = parts._replace(netloc=f"{netloc[0]}@{host}" if len(netloc) == 2 else host)
    try:
        yield urllib.parse.urlunsplit(proxied)
    finally:
        stop.set()
        listener.close()
