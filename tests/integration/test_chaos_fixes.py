"""Regression tests on a real broker for what the chaos suite (tests/chaos) found.

* A connection lost while retry / dead-letter copies await their confirms: the pika
  runtime's I/O thread died (the consumer process exited with it).
* A message that kills its consumer on every delivery looped forever on a classic
  queue (the redelivered flag does not count): now max_attempts holds.
* Many handlers finishing at once: settle frames overtook each other (a straggler's
  single ack after the multiple-ack that covered it: unknown delivery tag).
"""

from __future__ import annotations

import asyncio
import logging
import random
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from _apps import Runner, proxied
from _retry_support import Worker, channel, drain, header_text, publish, read_log, wait_until

from ackkit import App, AsyncApp, Delivery, Retry
from ackkit import connect as ackkit_connect
from ackkit._core import headers as H

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

        @app.listener(q, retry=RETRY, prefetch=10, concurrency=n)
        def handle(d: Delivery) -> None:
            entered.append(d.message_id or "")
            if d.attempt == 1:
                gate.wait(20)
            raise Boom("fails")

    else:
        app = AsyncApp(url, reconnect_max_interval=1.0)

        @app.listener(q, retry=RETRY, prefetch=10, max_concurrency=n)
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


def test_message_that_kills_its_consumer_stops_at_max_attempts_on_a_classic_queue(
    rabbitmq: Any, fresh_queue: str, tmp_path: Path
) -> None:
    """Killed inside the handler at every delivery. The redelivered flag only says
    "again", so the message came back as attempt 2 forever; now each redelivery is
    stamped with its attempt and the third loss sends it to the DLQ."""
    q, dlq = fresh_queue, f"{fresh_queue}.dlq"
    log = tmp_path / "calls.jsonl"
    publish(rabbitmq.url, q, b"{}", message_id="killer", declare=True)
    calls: list[int] = []
    for _ in range(6):
        before = len([e for e in read_log(log) if "attempt" in e])
        w = Worker(rabbitmq.url, q, log, "--hold", "30", "--max-attempts", "3").start()
        try:
            wait_until(
                lambda w=w, b=before: len(w.invocations()) > b or rabbitmq.counts(dlq).ready,
                timeout=15,
            )
            calls = [c["attempt"] for c in w.invocations()]
            if len(calls) == before:  # not run: it went to the DLQ
                rabbitmq.wait_for(q, ready=0, unacked=0, timeout=10)
                break
            w.kill()  # inside the 30 s hold: the delivery dies with its consumer
            rabbitmq.wait_for(q, unacked=0, consumers=0, timeout=10)
        finally:
            w.kill()
    else:
        raise AssertionError(f"the message loops: attempts {calls}")
    assert calls == [1, 2, 3]
    [(props, _)] = drain(rabbitmq.url, dlq)
    assert header_text(props.headers[H.REASON]) == "attempts exhausted (3 of 3, last one lost)"


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

        @app.listener(q, prefetch=60, concurrency=8)
        def handle(d: Delivery) -> None:
            note(d)
            time.sleep(random.random() * 0.004)
            if d.message_id in bad:
                raise Boom("to the DLQ")

    else:
        app = AsyncApp(rabbitmq.url)

        @app.listener(q, prefetch=60, max_concurrency=24)
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

        @app.listener(q, retry=retry, queue_arguments={"x-queue-type": queue_type})
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
