"""Settlement bookkeeping with copies in flight: a multiple settle never covers a decided delivery.

MANUAL mode with concurrent handlers: one delivery is rejected (its dead-letter
copy is published and awaits the broker's confirm) while another handler
nacks with multiple=True and requeue. A multiple frame would have requeued the
rejected delivery as well: handled again and dead-lettered twice (and the core
raised IndexError when the first copy's confirm came). The broker is asked how
many dead letters there are and what is left.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections import Counter
from typing import Any

import pytest

from ackkit import AckMode, Consumer, Delivery
from ackkit.errors import AlreadySettled
from tests.contract.conftest import IO, Broker, Runtime, eventually

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("round_", range(3))
def test_multiple_requeue_while_a_dead_letter_copy_awaits_its_confirm(
    runtime: Runtime, broker: Broker, queue_factory: Any, round_: int
) -> None:
    q = queue_factory(declare=True)
    seen: Counter[int] = Counter()
    lock = threading.Lock()
    rejected = threading.Event()

    async def handle(p: dict[str, int], d: Delivery, io: IO) -> None:
        i = p["id"]
        with lock:
            seen[i] += 1
            first = seen[i] == 1
        if i == 0:
            await io.reject(d)  # dead-lettered: its copy goes out, the confirm is pending
            rejected.set()
            return
        if i == 5 and first:
            while not rejected.is_set():
                await io.sleep(0.001)
            await io.nack(d, requeue=True, multiple=True)  # must not cover delivery 0
            return
        if first and i < 5:
            while seen[5] == 0:
                await io.sleep(0.001)  # stay unsettled until 5 nacks them all back
            await io.sleep(0.05)
        with contextlib.suppress(AlreadySettled):  # settled by the multiple nack meanwhile
            await io.ack(d)

    app = runtime.app()
    runtime.listen(
        app,
        q,
        handle,
        dict,
        ack_mode=AckMode.MANUAL,
        consumer=Consumer(concurrency=8, prefetch=20),
    )
    broker.publish(q, [json.dumps({"id": i}) for i in range(6)])
    with runtime.running(app):
        broker.wait_for(f"{q}.dlq", ready=1)
        eventually(lambda: all(seen[i] >= 1 for i in range(6)), what="all handled")
        broker.wait_for(q, ready=0, unacked=0, timeout=30)
        assert app.is_running
    dead = broker.take_all(f"{q}.dlq")
    assert [json.loads(m.body)["id"] for m in dead] == [0]  # once, never twice
    assert seen[0] == 1, seen
