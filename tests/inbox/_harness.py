"""Run an App or an AsyncApp with inbox listeners from a sync test, and read the rows."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg

from ackkit import App, AsyncApp, Consumer, Delivery, FlushPolicy, Retry, RetryStrategy
from ackkit.inbox import Inbox


class LoopThread:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, Any], timeout: float = 60.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


def effects_table(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("CREATE TABLE IF NOT EXISTS effects (id bigserial, msg text, note text)")


def effects(dsn: str) -> list[str]:
    with psycopg.connect(dsn) as c:
        return [r[0] for r in c.execute("SELECT msg FROM effects ORDER BY id").fetchall()]


def inbox_keys(dsn: str, table: str = "ackkit_inbox") -> list[tuple[str, str]]:
    with psycopg.connect(dsn) as c:
        rows = c.execute(f"SELECT listener, key FROM {table} ORDER BY key").fetchall()
        return [(r[0], r[1]) for r in rows]


def eventually(check: Callable[[], bool], timeout: float = 20.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or check}")
        time.sleep(0.05)


class Behaviour:
    """What a test handler does: insert an effect row, then maybe fail or sleep."""

    def __init__(
        self,
        fail_times: int = 0,
        sleep: float = 0.0,
        always_fail: bool = False,
        stall_after: int | None = None,
    ):
        self.fail_times = fail_times
        self.sleep = sleep
        self.always_fail = always_fail
        self.stall_after = stall_after
        """Calls after this many wait (before their insert) until `released` is set: a
        test's fault lands mid-run however fast or slow the machine is."""
        self.released = threading.Event()
        self.calls = 0
        self.succeeded: list[str] = []
        """Keys of the calls that returned (the effects an in-memory inbox guards)."""
        self.lock = threading.Lock()


def build(
    kind: str,
    url: str,
    queue: str,
    inbox: Inbox,
    b: Behaviour,
    *,
    retry: Retry | None = None,
    concurrency: int = 1,
    flush: FlushPolicy | None = None,
    name: str | None = None,
    **options: Any,
) -> Any:
    """An App (kind "sync") or AsyncApp ("async") with one inbox listener running `b`."""
    cname = f"inbox-{kind}-{uuid.uuid4().hex[:6]}"
    retry = retry or Retry(max_attempts=3, initial_interval=0.05, strategy=RetryStrategy.IN_PROCESS)
    if kind == "sync":
        app: Any = App(url, connection_name=cname)

        @app.listener(
            queue,
            inbox=inbox,
            retry=retry,
            consumer=Consumer(concurrency=concurrency, flush=flush),
            name=name,
            **options,
        )
        def handle(body: bytes, d: Delivery) -> None:
            with b.lock:
                b.calls += 1
                n = b.calls
            if b.stall_after is not None and n > b.stall_after:
                b.released.wait(120)
            if d.db:  # false on the in-memory inbox
                d.db.execute(
                    "INSERT INTO effects (msg) VALUES (%s)", (d.message_id or body.decode(),)
                )
            if b.sleep:
                time.sleep(b.sleep)
            if b.always_fail or n <= b.fail_times:
                raise RuntimeError(f"boom {n}")
            with b.lock:
                b.succeeded.append(d.message_id or body.decode())

    else:
        app = AsyncApp(url, connection_name=cname)

        @app.listener(
            queue,
            inbox=inbox,
            retry=retry,
            consumer=Consumer(concurrency=concurrency, flush=flush),
            name=name,
            **options,
        )
        async def ahandle(body: bytes, d: Delivery) -> None:
            b.calls += 1
            n = b.calls
            if b.stall_after is not None and n > b.stall_after:
                for _ in range(12_000):  # at most 120 s, without blocking the loop
                    if b.released.is_set():
                        break
                    await asyncio.sleep(0.01)
            if d.db:  # false on the in-memory inbox
                await d.db.execute(
                    "INSERT INTO effects (msg) VALUES (%s)", (d.message_id or body.decode(),)
                )
            if b.sleep:
                await asyncio.sleep(b.sleep)
            if b.always_fail or n <= b.fail_times:
                raise RuntimeError(f"boom {n}")
            b.succeeded.append(d.message_id or body.decode())

    app.connection_name_for_tests = cname
    return app


@contextmanager
def running(kind: str, app: Any) -> Iterator[Any]:
    if kind == "sync":
        app.start()
        try:
            yield app
        finally:
            app.stop()
        return
    lt = LoopThread()
    lt.run(app.start())
    try:
        yield app
    finally:
        lt.run(app.stop())
        lt.close()


def close_connections_named(broker: Any, name: str) -> int:
    """Force-close the broker connections whose connection_name is `name`."""
    closed: int = broker.close_connections_named(name, "closed by the inbox tests")
    return closed
