"""The contract harness: one behaviour, written once, run on the pika App and on AsyncApp,
on a real RabbitMQ and on the test kit's in-memory broker (the third transport).

A behaviour is an `async def behaviour(payload, delivery, io)`; it settles through
`io` (`await io.ack(d)`, ...) and sleeps with `await io.sleep(s)`. The sync
runtime gets a plain `def` handler that drives the coroutine to completion
without an event loop (nothing in it ever really suspends); the async runtime
gets an `async def` handler that awaits it, with `AsyncDelivery` settles.
What the tests assert comes from the broker (queue counts, dead-letter queue
contents and headers), through the `ackkit.testing` kit.

On the in-memory broker every test runs except those in `MEMORY_SKIPS`, skipped
by name with the reason: what that broker does not model. It follows RabbitMQ 3.13's
rules; the version tests (test_broker_versions.py) run on a fourth transport too,
"memory-4.3", the in-memory broker under RabbitMQ 4.3's rules (`MEMORY_43_SKIPS`).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from dataclasses import dataclass
from typing import Any

import pika
import pytest

from ackkit import App, AsyncApp, Delivery
from ackkit._app.spec import AppBase
from ackkit.testing import BrokerHandle, InMemoryBroker
from ackkit.testing.plugin import QueueFactory

Behaviour = Callable[[Any, Delivery, "IO"], Awaitable[Any]]


class IO:
    """How a behaviour settles and waits; one flavour per runtime."""

    async def ack(self, d: Delivery, multiple: bool = False) -> None:
        raise NotImplementedError

    async def nack(self, d: Delivery, requeue: bool = True, multiple: bool = False) -> None:
        raise NotImplementedError

    async def reject(self, d: Delivery, requeue: bool = False) -> None:
        raise NotImplementedError

    async def sleep(self, seconds: float) -> None:
        raise NotImplementedError


class SyncIO(IO):
    async def ack(self, d: Delivery, multiple: bool = False) -> None:
        d.ack(multiple=multiple)

    async def nack(self, d: Delivery, requeue: bool = True, multiple: bool = False) -> None:
        d.nack(requeue=requeue, multiple=multiple)

    async def reject(self, d: Delivery, requeue: bool = False) -> None:
        d.reject(requeue=requeue)

    async def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


class AsyncIO(IO):
    async def ack(self, d: Delivery, multiple: bool = False) -> None:
        await d.ack(multiple=multiple)  # type: ignore[func-returns-value]

    async def nack(self, d: Delivery, requeue: bool = True, multiple: bool = False) -> None:
        await d.nack(requeue=requeue, multiple=multiple)  # type: ignore[func-returns-value]

    async def reject(self, d: Delivery, requeue: bool = False) -> None:
        await d.reject(requeue=requeue)  # type: ignore[func-returns-value]

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


def drive(coro: Coroutine[Any, Any, Any]) -> Any:
    """Run a coroutine that never suspends (SyncIO only) to completion, synchronously."""
    try:
        coro.send(None)
    except StopIteration as stop:
        return stop.value
    coro.close()
    raise RuntimeError("a behaviour suspended on the sync runtime")


class LoopThread:
    """An asyncio event loop in a background thread, for driving AsyncApp from sync tests."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="contract-loop")
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, Any], timeout: float = 60.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@dataclass
class Msg:
    body: bytes
    headers: dict[str, Any]


class Broker:
    """The test's view of the broker: publish, read a queue, counts."""

    def __init__(self, handle: BrokerHandle) -> None:
        self.handle = handle

    def publish(
        self,
        queue: str,
        bodies: list[str | bytes],
        *,
        content_type: str | None = "application/json",
        headers: dict[str, Any] | None = None,
    ) -> None:
        conn = self.handle.connect()
        try:
            ch = conn.channel()
            ch.confirm_delivery()
            for b in bodies:
                props = pika.BasicProperties(
                    content_type=content_type,
                    delivery_mode=2,
                    headers=headers,
                    message_id=uuid.uuid4().hex,
                )
                ch.basic_publish("", queue, b.encode() if isinstance(b, str) else b, props)
        finally:
            conn.close()

    def take_all(self, queue: str) -> list[Msg]:
        """Every ready message of `queue` (consumed with auto-ack)."""
        out: list[Msg] = []
        conn = self.handle.connect()
        try:
            ch = conn.channel()
            while True:
                method, props, body = ch.basic_get(queue, auto_ack=True)
                if method is None:
                    return out
                out.append(Msg(body, dict(props.headers or {})))
        finally:
            conn.close()

    def wait_for(self, queue: str, timeout: float = 15.0, **want: int) -> Any:
        return self.handle.wait_for(queue, timeout=timeout, **want)

    def counts(self, queue: str) -> Any:
        return self.handle.counts(queue)

    def close_connections_named(self, name: str) -> int:
        """Force-close (CONNECTION_FORCED) the connections whose connection_name is `name`.

        Only the app under test loses its connection, even on a shared broker."""
        return self.handle.close_connections_named(name, "closed by the ackkit contract suite")


def eventually(check: Callable[[], bool], timeout: float = 15.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what or check}")
        time.sleep(0.02)


class Runtime:
    """Adapter: build an app, register a behaviour as a listener, run the app."""

    kind = "?"
    is_async = False
    """AsyncApp (an event loop in a thread) rather than App (threads)."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.url = broker.handle.url
        self.connection_name = f"contract-{self.kind}-{uuid.uuid4().hex[:8]}"

    def app(self, **kw: Any) -> AppBase:
        raise NotImplementedError

    def handler(self, behaviour: Behaviour, payload: Any) -> Callable[..., Any]:
        raise NotImplementedError

    def listen(
        self, app: AppBase, queue: Any, behaviour: Behaviour, payload: Any = Delivery, **kw: Any
    ) -> None:
        fn = self.handler(behaviour, payload)
        fn.__annotations__ = {"payload": payload, "delivery": Delivery, "return": None}
        fn.__name__ = fn.__qualname__ = getattr(behaviour, "__name__", "handler")
        app.listener(queue, **kw)(fn)

    @contextlib.contextmanager
    def running(self, app: AppBase) -> Iterator[AppBase]:
        raise NotImplementedError
        yield app

    def stop(self, app: AppBase) -> None:
        raise NotImplementedError

    def stats(self, app: AppBase) -> dict[str, int]:
        """Counters of the app's only listener."""
        (s,) = app.stats().values()  # type: ignore[attr-defined]
        return dict(s)

    @contextlib.contextmanager
    def pull(self) -> Iterator[Any]:
        raise NotImplementedError
        yield None


class SyncRuntime(Runtime):
    kind = "sync"

    def app(self, **kw: Any) -> AppBase:
        kw.setdefault("shutdown_timeout", 5.0)
        kw.setdefault("reconnect_max_interval", 1.0)
        return App(self.url, connection_name=self.connection_name, **kw)

    def handler(self, behaviour: Behaviour, payload: Any) -> Callable[..., Any]:
        io = SyncIO()

        def handler(payload: Any, delivery: Delivery) -> Any:
            return drive(behaviour(payload, delivery, io))  # type: ignore[arg-type]

        return handler

    @contextlib.contextmanager
    def running(self, app: AppBase) -> Iterator[AppBase]:
        assert isinstance(app, App)
        app.start()
        try:
            yield app
        finally:
            app.stop()

    def stop(self, app: AppBase) -> None:
        assert isinstance(app, App)
        app.stop()

    @contextlib.contextmanager
    def pull(self) -> Iterator[Any]:
        import ackkit

        with ackkit.connect(self.url) as conn:
            yield SyncPull(conn)


class Amqp10Runtime(SyncRuntime):
    """The App over AMQP 1.0 (`protocol="amqp1.0"`): RabbitMQ 4.0 and later only."""

    kind = "amqp10"

    def app(self, **kw: Any) -> AppBase:
        kw.setdefault("protocol", "amqp1.0")
        return super().app(**kw)

    @contextlib.contextmanager
    def pull(self) -> Iterator[Any]:
        pytest.skip("pull mode speaks AMQP 0-9-1 only")
        yield None


class SyncPull:
    def __init__(self, conn: Any) -> None:
        self.conn = conn

    def get(self, queue: str, **kw: Any) -> Delivery | None:
        d: Delivery | None = self.conn.get(queue, **kw)
        return d

    def ack(self, d: Delivery) -> None:
        d.ack()

    def reject(self, d: Delivery, requeue: bool = False) -> None:
        d.reject(requeue=requeue)


class AsyncRuntime(Runtime):
    kind = "async"
    is_async = True

    def __init__(self, broker: Broker, loop: LoopThread) -> None:
        super().__init__(broker)
        self.lt = loop

    def app(self, **kw: Any) -> AppBase:
        kw.setdefault("shutdown_timeout", 5.0)
        kw.setdefault("reconnect_max_interval", 1.0)
        return AsyncApp(self.url, connection_name=self.connection_name, **kw)

    def handler(self, behaviour: Behaviour, payload: Any) -> Callable[..., Any]:
        io = AsyncIO()

        async def handler(payload: Any, delivery: Delivery) -> Any:
            return await behaviour(payload, delivery, io)

        return handler

    @contextlib.contextmanager
    def running(self, app: AppBase) -> Iterator[AppBase]:
        assert isinstance(app, AsyncApp)
        self.lt.run(app.start())
        try:
            yield app
        finally:
            self.lt.run(app.stop())

    def stop(self, app: AppBase) -> None:
        assert isinstance(app, AsyncApp)
        self.lt.run(app.stop())

    @contextlib.contextmanager
    def pull(self) -> Iterator[Any]:
        from ackkit.pull import AsyncPullConnection

        conn = AsyncPullConnection(self.url)
        self.lt.run(conn.open())
        try:
            yield AsyncPull(conn, self.lt)
        finally:
            self.lt.run(conn.close())


class AsyncPull:
    def __init__(self, conn: Any, lt: LoopThread) -> None:
        self.conn = conn
        self.lt = lt

    def get(self, queue: str, **kw: Any) -> Delivery | None:
        d: Delivery | None = self.lt.run(self.conn.get(queue, **kw), timeout=600)
        return d

    def ack(self, d: Delivery) -> None:
        self.lt.run(d.ack())  # type: ignore[func-returns-value]

    def reject(self, d: Delivery, requeue: bool = False) -> None:
        self.lt.run(d.reject(requeue=requeue))  # type: ignore[func-returns-value]


@pytest.fixture(scope="session")
def loop_thread() -> Iterator[LoopThread]:
    lt = LoopThread()
    yield lt
    lt.close()


MEMORY_SKIPS = {
    "test_refused_login_fails_start_at_once": (
        "the in-memory broker has no users or passwords: nothing to refuse"
    ),
    "test_consumer_priority_and_exclusive_reach_the_broker": (
        "it reads the consumers' arguments with rabbitmqctl; the in-memory broker has no node"
    ),
    "test_single_active_consumer_standby_is_not_an_error": (
        "the in-memory broker does not implement x-single-active-consumer"
    ),
}
"""Contract tests the in-memory broker does not run, by name, and why."""

MEMORY_43_SKIPS = {
    "test_a_consumer_timeout_on_43_cancels_the_consumer_and_ackkit_consumes_again": (
        "the in-memory broker does not model consumer timeouts"
    ),
    "test_quorum_delayed_retry_on_43_and_refused_before": (
        "the in-memory broker does not model 4.3's native delayed retry (x-delayed-retry-*)"
    ),
}
"""What the in-memory broker under RabbitMQ 4.3's rules does not run, besides MEMORY_SKIPS."""

MEMORY_RABBITMQ = {"memory": None, "memory-4.3": "4.3"}
"""The in-memory transports and the RabbitMQ rules each follows (None: the default 3.13)."""


def _transport(request: pytest.FixtureRequest) -> str:
    name = request.node.originalname
    reason = None
    if request.param in MEMORY_RABBITMQ:
        reason = MEMORY_SKIPS.get(name)
    if request.param == "memory-4.3" and reason is None:
        reason = MEMORY_43_SKIPS.get(name)
    if reason is not None:
        pytest.skip(f"{request.param} broker: {reason}")
    return str(request.param)


@pytest.fixture(params=["rabbitmq", "memory"])
def transport(request: pytest.FixtureRequest) -> str:
    """Where the test's broker is: a real RabbitMQ, or the kit's InMemoryBroker."""
    return _transport(request)


@pytest.fixture(params=["rabbitmq", "memory", "memory-4.3"])
def version_transport(request: pytest.FixtureRequest) -> str:
    """The transports of the version tests: the in-memory broker under 4.3's rules too."""
    return _transport(request)


@pytest.fixture
def broker(request: pytest.FixtureRequest, transport: str) -> Iterator[Broker]:
    if transport == "rabbitmq":
        yield Broker(request.getfixturevalue("rabbitmq"))
        return
    with InMemoryBroker(rabbitmq=MEMORY_RABBITMQ[transport]) as memory:
        yield Broker(memory)


@pytest.fixture
def queue_factory(request: pytest.FixtureRequest, broker: Broker) -> Iterator[Any]:
    """The kit's queue_factory, on the test's broker (real or in-memory)."""
    factory = QueueFactory(request)

    def make(tag: str = "", **kw: Any) -> str:
        kw.setdefault("broker", broker.handle)
        return factory(tag, **kw)

    yield make
    factory.cleanup()


@pytest.fixture(params=["sync", "async", "amqp10"])
def runtime(request: pytest.FixtureRequest, broker: Broker, transport: str) -> Runtime:
    if request.param == "sync":
        return SyncRuntime(broker)
    if request.param == "amqp10":
        if transport != "rabbitmq":
            pytest.skip("AMQP 1.0 runs against a real RabbitMQ 4.x (no in-memory broker yet)")
        if int(broker.handle.server_version().split(".")[0]) < 4:
            pytest.skip("AMQP 1.0 needs RabbitMQ 4.0 or later")
        return Amqp10Runtime(broker)
    return AsyncRuntime(broker, request.getfixturevalue("loop_thread"))
