"""What only the asyncio runtime has: plain `def` handlers on AsyncApp, AsyncDelivery,
the optional-extra import path. Broker-backed, like the rest of the contract suite."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from typing import Any

import pytest

import ackkit
from ackkit import AckMode, AsyncApp, AsyncDelivery, Consumer, Delivery
from ackkit.errors import AlreadySettled

from .conftest import Broker, LoopThread, eventually

pytestmark = pytest.mark.contract


def test_plain_def_handler_acks_from_its_thread(
    broker: Broker, queue_factory: Any, loop_thread: LoopThread
) -> None:
    q = queue_factory(declare=True)
    seen: list[tuple[str, str]] = []
    app = AsyncApp(broker.handle.url, shutdown_timeout=5)

    @app.listener(q, ack_mode=AckMode.MANUAL, consumer=Consumer(concurrency=3))
    def handle(body: dict[str, Any], d: Delivery) -> None:
        assert type(d) is Delivery  # a blocking ack(), not a coroutine
        d.ack()
        try:
            d.ack()
        except AlreadySettled:
            seen.append((threading.current_thread().name, "twice"))

    broker.publish(q, [json.dumps({"i": i}) for i in range(6)])
    loop_thread.run(app.start())
    try:
        eventually(lambda: len(seen) == 6)
        broker.wait_for(q, ready=0, unacked=0)
    finally:
        loop_thread.run(app.stop())
    assert all(name.startswith("ackkit-") and how == "twice" for name, how in seen)


def test_async_handler_annotated_delivery_gets_an_async_delivery(
    broker: Broker, queue_factory: Any, loop_thread: LoopThread
) -> None:
    q = queue_factory(declare=True)
    got: list[Delivery] = []
    app = AsyncApp(broker.handle.url)

    @app.listener(q, ack_mode=AckMode.MANUAL)
    async def handle(d: Delivery) -> None:
        got.append(d)
        assert isinstance(d, AsyncDelivery)
        await d.ack()  # type: ignore[func-returns-value]

    broker.publish(q, ["{}"])
    loop_thread.run(app.start())
    try:
        eventually(lambda: len(got) == 1)
        broker.wait_for(q, ready=0, unacked=0)
    finally:
        loop_thread.run(app.stop())


def test_plain_def_handler_cannot_ask_for_an_async_delivery() -> None:
    app = AsyncApp()
    with pytest.raises(TypeError, match="async def"):

        @app.listener("q")
        def handle(d: AsyncDelivery) -> None: ...


def test_without_aio_pika_the_import_error_has_the_install_hint() -> None:
    code = (
        "import sys; sys.modules['aio_pika'] = None\n"
        "import ackkit\n"
        "assert ackkit.AsyncDelivery is not None\n"
        "try:\n    ackkit.AsyncApp\nexcept ImportError as e:\n    print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert 'pip install "ackkit[async]"' in out.stdout
    assert sorted(ackkit.__all__) == ackkit.__all__
    assert {"AsyncApp", "AsyncDelivery", "aconnect"} <= set(ackkit.__all__)
    assert {"AsyncPullConnection", "aconnect"} <= set(ackkit.pull.__all__)
