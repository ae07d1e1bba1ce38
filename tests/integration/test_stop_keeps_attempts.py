"""A graceful stop costs no attempt (issue 20), read back from the broker.

Retry(max_attempts=2), prefetch 20, the app stopped after 3 of 10 handlers had
started: the unstarted came back counted as attempt 1 (the broker counts every
return: the redelivered flag on classic queues, x-delivery-count on quorum queues
before 4.3, x-acquired-count on 4.3) and, when the next handler failed once, were
dead-lettered as "attempts exhausted (2 of 2)" after one run. Now each goes back as
a copy carrying the attempt it had; the next app runs it as attempt 1, then 2.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest
from _apps import Runner
from _retry_support import drain, header_text, wait_until

from ackkit import App, AsyncApp, AsyncDelivery, Consumer, Delivery, Queue, Retry
from ackkit._core import headers as H

pytestmark = pytest.mark.integration

N = 10
QUORUM = {"x-queue-type": "quorum"}


def _app(kind: str, url: str, q: str, args: Any, runs: dict[str, list[int]], fail: bool) -> Runner:
    lock = threading.Lock()
    retry = Retry(max_attempts=2, initial_interval=0.1)

    def record(d: Any) -> None:
        with lock:
            runs.setdefault(str(d.message_id), []).append(d.attempt)

    if kind == "App":
        app: Any = App(url)

        @app.listener(Queue(q, arguments=args), retry=retry, consumer=Consumer(prefetch=20))
        def h(d: Delivery) -> None:
            record(d)
            if fail:
                raise ValueError("fails")
            time.sleep(0.3)

    else:
        app = AsyncApp(url)

        @app.listener(Queue(q, arguments=args), retry=retry, consumer=Consumer(prefetch=20))
        async def ah(d: AsyncDelivery) -> None:
            record(d)
            if fail:
                raise ValueError("fails")
            await asyncio.sleep(0.3)

    return Runner(app)


@pytest.mark.parametrize("queue_type", ["classic", "quorum"])
@pytest.mark.parametrize("kind", ["App", "AsyncApp"])
def test_a_graceful_stop_costs_no_attempt(
    rabbitmq: Any, queue_factory: Any, kind: str, queue_type: str
) -> None:
    q = queue_factory()
    args = QUORUM if queue_type == "quorum" else None
    first: dict[str, list[int]] = {}
    r = _app(kind, rabbitmq.url, q, args, first, fail=False)
    r.start()
    try:
        import ackkit

        with ackkit.connect(rabbitmq.url) as c:
            for i in range(N):
                c.publish(q, b"{}", message_id=f"m{i}")
        assert wait_until(lambda: len(first) >= 3, timeout=10)
    finally:
        r.stop()
    unstarted = {f"m{i}" for i in range(N)} - set(first)
    assert len(unstarted) >= N - 4, first
    # nothing lost, nothing doubled (a look at their headers would be one more return)
    rabbitmq.wait_for(q, ready=len(unstarted), unacked=0, timeout=10)
    second: dict[str, list[int]] = {}
    r = _app(kind, rabbitmq.url, q, args, second, fail=True)
    r.start()
    try:
        rabbitmq.wait_for(f"{q}.dlq", ready=len(unstarted), timeout=30)
        rabbitmq.wait_for(q, ready=0, unacked=0, timeout=10)
    finally:
        r.stop()
    print(
        f"FIG stop-attempts {kind} {queue_type}: first run started {len(first)}, "
        f"unstarted {len(unstarted)}, their runs {sorted({tuple(second[m]) for m in unstarted})}"
    )
    assert {m: second[m] for m in unstarted} == {m: [1, 2] for m in unstarted}
    dead = drain(rabbitmq.url, f"{q}.dlq")
    assert sorted(p.message_id for p, _ in dead) == sorted(unstarted)
    for p, _ in dead:
        assert p.headers[H.ATTEMPTS] == 2
        assert header_text(p.headers[H.REASON]).startswith("attempts exhausted (2 of 2)")
