"""Many handlers finishing at once on a real broker: settle frames never overtake each
other (a straggler's single ack after the multiple-ack that covered it was an
unknown delivery tag, and the broker closed the channel)."""

from __future__ import annotations

import asyncio
import logging
import random
import threading
import time
from typing import Any

import pytest
from _apps import Runner
from _retry_support import drain

from ackkit import App, AsyncApp, Consumer, Delivery

pytestmark = pytest.mark.integration


class Boom(Exception):
    """What the failing handlers raise."""


@pytest.mark.parametrize("runtime", ["sync", "async"])
def test_many_handlers_finishing_at_once_never_send_an_unknown_tag(
    rabbitmq: Any, fresh_queue: str, runtime: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Out-of-order finishes, straggler acks, dead letters and their confirm-acks, all at
    once and without any fault: every message is acked or dead-lettered exactly once and
    the broker never closes the channel (it did: unknown delivery tag)."""
    q, n = fresh_queue, 1500
    bad = {f"m{i}" for i in range(n) if i % 7 == 0}
    seen: dict[str, int] = {}
    lock = threading.Lock()

    def note(d: Delivery) -> None:
        with lock:
            seen[d.message_id or ""] = seen.get(d.message_id or "", 0) + 1

    app: App | AsyncApp
    if runtime == "sync":
        app = App(rabbitmq.url)

        @app.listener(q, consumer=Consumer(prefetch=60, concurrency=8))
        def handle(d: Delivery) -> None:
            note(d)
            time.sleep(random.random() * 0.004)
            if d.message_id in bad:
                raise Boom("to the DLQ")

    else:
        app = AsyncApp(rabbitmq.url)

        @app.listener(q, consumer=Consumer(prefetch=60, concurrency=24))
        async def ahandle(d: Delivery) -> None:
            note(d)
            await asyncio.sleep(random.random() * 0.004)
            if d.message_id in bad:
                raise Boom("to the DLQ")

    caplog.set_level(logging.INFO, logger="ackkit")
    runner = Runner(app)
    runner.start()
    try:
        import ackkit

        with ackkit.connect(rabbitmq.url) as c:
            for i in range(n):
                c.publish(q, b"{}", message_id=f"m{i}")
        rabbitmq.wait_for(f"{q}.dlq", ready=len(bad), timeout=120)
        rabbitmq.wait_for(q, ready=0, unacked=0, timeout=30)
    finally:
        runner.stop()
    text = caplog.text
    assert "unknown delivery tag" not in text
    assert "channel closed by" not in text
    assert all(v == 1 for v in seen.values()) and len(seen) == n
    assert len(drain(rabbitmq.url, f"{q}.dlq")) == len(bad)
