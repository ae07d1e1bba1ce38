"""Plain misuse: options that cannot work, and handlers written the way the source
documents write them. Every test runs on both runtimes against the broker and asserts
what the broker shows."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ackkit import AckMode, App, AsyncApp, AsyncDelivery, Consumer, Delivery, Queue, Retry
from ackkit.errors import TopologyConflict
from ackkit.testing import QueueNotFound
from tests.contract.conftest import IO, Broker, Runtime

pytestmark = [pytest.mark.integration]


def exists(broker: Broker, queue: str) -> bool:
    try:
        broker.counts(queue)
    except QueueNotFound:
        return False
    return True


def companions(broker: Broker, queue: str) -> list[str]:
    """`queue` and every queue ackkit would declare for it, that exist on the broker."""
    return [n for n in broker.handle.queue_names() if n == queue or n.startswith(f"{queue}.")]


class Count:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.n = 0

    def add(self) -> None:
        with self.lock:
            self.n += 1


# -- declare=False on a queue that does not exist --------------------------------------------


def test_declare_false_on_a_missing_queue_fails_start_fast_and_declares_nothing(
    runtime: Runtime, broker: Broker, queue_factory: Any
) -> None:
    missing = queue_factory("missing")
    other = queue_factory("other")  # declare=True: must not be declared either
    ran = Count()

    async def handle(payload: Any, d: Delivery, io: IO) -> None:
        ran.add()

    app = runtime.app(startup_timeout=120.0)
    runtime.listen(app, other, handle, Any, retry=Retry(max_attempts=3, initial_interval=0.1))
    runtime.listen(
        app,
        Queue(missing, declare=False),
        handle,
        Any,
        retry=Retry(max_attempts=3, initial_interval=0.1),
    )
    t0 = time.monotonic()
    with pytest.raises(TopologyConflict) as info, runtime.running(app):
        pytest.fail("start() succeeded on a missing declare=False queue")
    took = time.monotonic() - t0
    # At once, not after the startup timeout of retrying (120 s): the ceiling is generous
    # for a loaded machine and still far from it.
    assert took < 30.0, f"start() took {took:.1f} s to refuse"
    msg = str(info.value)
    assert repr(missing) in msg and "declare=False" in msg
    assert not app.is_running  # type: ignore[attr-defined]
    assert companions(broker, missing) == []
    assert companions(broker, other) == []  # checked before anything was declared
    assert ran.n == 0


def test_declare_false_on_an_existing_queue_consumes(
    runtime: Runtime, broker: Broker, queue_factory: Any
) -> None:
    q = queue_factory(declare=True)
    ran = Count()

    async def handle(payload: Any, d: Delivery, io: IO) -> None:
        ran.add()

    app = runtime.app()
    runtime.listen(app, Queue(q, declare=False), handle, dict)
    broker.publish(q, [json.dumps({"i": i}) for i in range(5)])
    with runtime.running(app):
        broker.wait_for(q, ready=0, unacked=0)
    assert ran.n == 5


# -- handlers as the source documents write them ----------------------------------------------


@pytest.mark.parametrize("mode", [AckMode.MANUAL, AckMode.INDIVIDUAL, AckMode.CLIENT])
def test_an_unannotated_manual_handler_gets_the_delivery_of_a_text_body(
    runtime: Runtime, broker: Broker, queue_factory: Any, mode: AckMode
) -> None:
    q = queue_factory(declare=True)
    ran = Count()
    app = runtime.app()
    if isinstance(app, AsyncApp):

        async def handle(msg):  # type: ignore[no-untyped-def]
            # a sibling of Delivery since 0.2, not a subclass
            assert isinstance(msg, AsyncDelivery) and msg.body.startswith(b"hello-")
            ran.add()
            await msg.ack()

    else:

        def handle(msg):  # type: ignore[no-untyped-def]
            assert isinstance(msg, Delivery) and msg.body.startswith(b"hello-")
            ran.add()
            msg.ack()

    app.listener(q, ack_mode=mode, consumer=Consumer(prefetch=10))(handle)
    n = 30
    broker.publish(q, [f"hello-{i}" for i in range(n)], content_type="text/plain")
    with runtime.running(app):
        broker.wait_for(q, ready=0, unacked=0)
        time.sleep(0.3)  # nothing comes back
        c = broker.counts(q)
        assert (c.ready, c.unacked) == (0, 0)
    assert ran.n == n
    assert not exists(broker, f"{q}.dlq") or broker.counts(f"{q}.dlq").ready == 0


def test_a_plain_def_unannotated_handler_on_asyncapp_settles(
    broker: Broker, queue_factory: Any, loop_thread: Any
) -> None:
    q = queue_factory(declare=True)
    ran = Count()
    app = AsyncApp(broker.handle.url, shutdown_timeout=5.0)

    def handle(msg):  # type: ignore[no-untyped-def]
        ran.add()
        msg.ack()  # a plain Delivery: the blocking ack of a thread-pool handler

    app.listener(q, ack_mode=AckMode.MANUAL, consumer=Consumer(concurrency=4))(handle)
    broker.publish(q, [f"hello-{i}" for i in range(10)], content_type="text/plain")
    loop_thread.run(app.start())
    try:
        broker.wait_for(q, ready=0, unacked=0)
    finally:
        loop_thread.run(app.stop())
    assert ran.n == 10


def test_a_coroutine_handler_is_refused_by_the_sync_app_before_anything_runs(
    broker: Broker, queue_factory: Any
) -> None:
    q = queue_factory()
    app = App(broker.handle.url)

    async def handle(msg):  # type: ignore[no-untyped-def]
        pass

    with pytest.raises(TypeError, match="AsyncApp"):
        app.listener(q)(handle)
    assert app.specs == []
    assert companions(broker, q) == []


# -- bodies that cannot be decoded -----------------------------------------------------------


def deep(depth: int, kind: str) -> bytes:
    # Python's own limit is 1,000 frames, but hypothesis raises it while a test runs
    if kind == "array":
        return b"[" * depth + b"]" * depth
    return b'{"a":' * depth + b"1" + b"}" * depth


@settings(
    max_examples=4,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    depths=st.lists(
        st.tuples(st.integers(20_000, 300_000), st.sampled_from(["array", "object"])),
        min_size=1,
        max_size=4,
    )
)
def test_deeply_nested_json_is_dead_lettered_on_its_first_attempt(
    runtime: Runtime, broker: Broker, queue_factory: Any, depths: list[tuple[int, str]]
) -> None:
    q = queue_factory(declare=True)
    ran = Count()

    async def handle(body: Any, d: Delivery, io: IO) -> None:
        ran.add()

    app = runtime.app()
    runtime.listen(app, q, handle, dict, retry=Retry(max_attempts=3, initial_interval=0.1))
    broker.publish(q, [deep(n, kind) for n, kind in depths])
    with runtime.running(app):
        broker.wait_for(f"{q}.dlq", ready=len(depths))
        broker.wait_for(q, ready=0, unacked=0)
    dead = broker.take_all(f"{q}.dlq")
    assert len(dead) == len(depths)
    for m in dead:
        assert m.headers["ackkit-attempts"] == 1, m.headers
        assert m.headers["ackkit-reason"].startswith("bad payload"), m.headers["ackkit-reason"]
    assert ran.n == 0
    for name in companions(broker, q):  # no retry copy is waiting anywhere
        if ".retry." in name:
            assert broker.counts(name).total == 0


# -- options refused before anything is declared ---------------------------------------------


@pytest.mark.parametrize(
    "kw",
    [
        {"dead_letter": ""},
        {"dead_letter": "{queue}"},
        {"dead_letter": "{queue}.retry.100ms"},
        {"consumer": lambda: Consumer(prefetch=70_000)},
        {"queue": lambda q: Queue(q, arguments={"x-queue-type": "stream"})},
        {"queue": lambda q: Queue(q, arguments={"x-max-length": 2**70})},
        {"consumer": lambda: Consumer(arguments={"k" * 300: 1})},
    ],
    ids=[
        "dlq-empty",
        "dlq-own-queue",
        "dlq-delay-queue",
        "prefetch",
        "stream",
        "int-past-64-bits",
        "key-over-255-bytes",
    ],
)
def test_options_that_cannot_work_are_refused_before_any_queue_is_declared(
    runtime: Runtime, broker: Broker, queue_factory: Any, kw: dict[str, Any]
) -> None:
    q = queue_factory()

    async def handle(payload: Any, d: Delivery, io: IO) -> None:
        pass

    app = runtime.app()
    retry = Retry(max_attempts=3, initial_interval=0.1)
    with pytest.raises(ValueError) as info:
        built = {k: v(q) if k == "queue" else v() if callable(v) else v for k, v in kw.items()}
        runtime.listen(app, built.pop("queue", q), handle, Any, retry=retry, **built)
    option = next(iter(kw))
    assert option in str(info.value).lower() or "x-queue-type" in str(info.value)
    assert app.specs == []
    assert companions(broker, q) == []


def test_an_overlong_queue_name_is_refused_at_registration(
    runtime: Runtime, broker: Broker
) -> None:
    app = runtime.app()

    async def handle(payload: Any, d: Delivery, io: IO) -> None:
        pass

    name = "t.misuse." + "x" * 300
    with pytest.raises(ValueError, match="255"):
        runtime.listen(app, name, handle, Any)
    assert app.specs == []
