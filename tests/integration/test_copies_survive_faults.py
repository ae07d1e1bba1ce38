"""Retry and dead-letter copies survive faults on a real broker: a connection cut
while copies await their confirms (the pika I/O thread used to die), a broker
restart while copies wait in a delay queue (classic dead-lettering is
at-most-once: they were lost on their way back into a quorum queue)."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest
from _apps import Runner, proxied
from _retry_support import channel, drain, header_text, publish, wait_until

from ackkit import App, AsyncApp, Consumer, Delivery, Queue, Retry
from ackkit import connect as ackkit_connect

pytestmark = pytest.mark.integration


RETRY = Retry(max_attempts=2, initial_interval=0.2)


class Boom(Exception):
    """What the failing handlers raise."""


@pytest.mark.parametrize("runtime", ["sync", "async"])
def test_connection_lost_while_copies_await_their_confirms(
    rabbitmq: Any, fresh_queue: str, runtime: str
) -> None:
    """Handlers fail, their retry copies go out, the confirms are held back, then the
    connection is cut. The pika runtime used to requeue the originals on the dead
    connection from the publisher channel's close callback: ConnectionWrongStateError
    in the I/O thread, which then died (a consumer process exited at every cut)."""
    q, n = fresh_queue, 5
    proxy, url = proxied(rabbitmq.url)
    gate = threading.Event()
    entered: list[str] = []
    app: App | AsyncApp
    if runtime == "sync":
        app = App(url, reconnect_max_interval=1.0)

        @app.listener(q, retry=RETRY, consumer=Consumer(prefetch=10, concurrency=n))
        def handle(d: Delivery) -> None:
            entered.append(d.message_id or "")
            if d.attempt == 1:
                gate.wait(20)
            raise Boom("fails")

    else:
        app = AsyncApp(url, reconnect_max_interval=1.0)

        @app.listener(q, retry=RETRY, consumer=Consumer(prefetch=10, concurrency=n))
        async def ahandle(d: Delivery) -> None:
            entered.append(d.message_id or "")
            if d.attempt == 1:
                await asyncio.get_running_loop().run_in_executor(None, gate.wait, 20)
            raise Boom("fails")

    runner = Runner(app)
    runner.start()
    try:
        for i in range(n):
            publish(rabbitmq.url, q, b"{}", message_id=f"m{i}")
        assert wait_until(lambda: len(entered) >= n, timeout=15)
        proxy.hold()  # the broker's confirms of the copies do not come back
        gate.set()  # all five fail now: five copies published, none confirmed
        time.sleep(0.5)
        assert proxy.cut() >= 1
        # Everything still ends in the DLQ: the runtime reconnected and went on.
        wait_until(lambda: rabbitmq.counts(f"{q}.dlq").ready >= n, timeout=30)
        rabbitmq.wait_for(q, ready=0, unacked=0, timeout=15)
        assert runner.alive()
    finally:
        runner.stop()
        proxy.close()
    ids = {header_text(p.message_id) for p, _ in drain(rabbitmq.url, f"{q}.dlq")}
    assert ids == {f"m{i}" for i in range(n)}


@pytest.mark.parametrize("queue_type", ["quorum", "classic"])
def test_retry_copies_waiting_in_a_delay_queue_survive_a_broker_restart(
    own_rabbitmq: Any, queue_factory: Any, queue_type: str
) -> None:
    """Copies waiting in a classic delay queue when the broker restarted were dropped on
    their way back into a quorum origin queue (classic dead-lettering is at-most-once):
    the chaos run lost 90 poison messages that way. Every copy comes back now."""
    broker = own_rabbitmq
    q = queue_factory(queue_type, broker=broker)
    n = 20
    ran: list[tuple[str, int]] = []

    def make() -> App:
        app = App(broker.url, reconnect_max_interval=1.0)
        retry = Retry(max_attempts=2, initial_interval=4.0)

        @app.listener(Queue(q, arguments={"x-queue-type": queue_type}), retry=retry)
        def handle(d: Delivery) -> None:
            ran.append((d.message_id or "", d.attempt))
            raise Boom("fails")

        return app

    app = make()
    with app.running():
        with ackkit_connect(broker.url) as c:
            for i in range(n):
                c.publish(q, b"{}", message_id=f"m{i}")
        assert wait_until(lambda: len(ran) >= n, timeout=20)
        # all copies wait in the delay queue (a quorum queue's counts lag: ask the queue)
        assert wait_until(lambda: ready_in(broker.url, f"{q}.retry.4000ms") == n, timeout=10)
    broker.restart()  # with the copies still in the delay queue (4 s)
    with make().running():
        assert wait_until(lambda: len(ran) >= 2 * n, timeout=60), sorted(ran)
        broker.wait_for(f"{q}.dlq", ready=n, timeout=20)
    assert sorted(a for _, a in ran) == [1] * n + [2] * n
    ids = {p.message_id for p, _ in drain(broker.url, f"{q}.dlq")}
    assert ids == {f"m{i}" for i in range(n)}


def ready_in(url: str, queue: str) -> int:
    with channel(url) as ch:
        return int(ch.queue_declare(queue, passive=True).method.message_count)
