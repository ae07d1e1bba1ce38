"""Broker-delayed retry and dead-lettering through quorum delay queues keep every message
when the node holding a delay queue's leader is killed (the test kit's 3-node cluster).

A listener with `Queue(name, quorum=True)` and broker retries (delay tiers of 5 s and
10 s) fails every message's first attempt, so all of them wait in the 5 s delay queue.
The node holding that queue's leader is SIGKILLed while they wait; the app is connected
to the other two nodes. The queue elects a leader on a survivor, its TTL goes on, and
its at-least-once dead-lettering hands every copy back to the listener's queue: half the
messages succeed on their second attempt, the other half ("poison") fail all three and
land in the quorum DLQ with their reason. The brokers are asked for the end state: the
listener's queue and the delay queues empty, nothing unacked, the DLQ holding exactly
the poison messages (read with ackkit's DLQ reader: reason, attempts, origin).
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any

import pika
import pytest
from _apps import Runner
from _retry_support import wait_until

from ackkit import App, AsyncApp, AsyncDelivery, Delivery, Queue, Retry
from ackkit.dead_letters import inspect_dead_letters
from ackkit.testing import BrokerError
from ackkit.testing.plugin import QueueFactory
from ackkit_testkit import ClusterHandle

pytestmark = pytest.mark.integration

MESSAGES = 200
RETRY = Retry(max_attempts=3, initial_interval=5.0, multiplier=2.0)  # 5 s, then 10 s
FIRST_TIER = "retry.5000ms"


def publish(cluster: ClusterHandle, via: int, queue: str, n: int) -> None:
    """Persistent messages m0..m{n-1}, each confirmed, through node `via`."""
    conn = cluster[via].connect(connection_attempts=1, socket_timeout=10, stack_timeout=15)
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        for i in range(n):
            props = pika.BasicProperties(delivery_mode=2, message_id=f"m{i}")
            ch.basic_publish("", queue, b"{}", props, mandatory=True)
    finally:
        conn.close()


def poison(message_id: str) -> bool:
    return int(message_id[1:]) % 2 == 1


def make_app(
    app_cls: type, urls: list[str], queue: str, calls: Counter[str], done: set[str]
) -> App | AsyncApp:
    lock = threading.Lock()
    app = app_cls(urls, heartbeat=5, reconnect_max_interval=1.0, startup_timeout=60)

    def outcome(d: Any) -> None:
        mid = str(d.message_id)
        with lock:
            calls[mid] += 1
        if d.attempt == 1 or poison(mid):
            raise RuntimeError(f"{mid} fails on attempt {d.attempt}")
        with lock:
            done.add(mid)

    if app_cls is App:

        @app.listener(Queue(queue, quorum=True), retry=RETRY)
        def h(d: Delivery) -> None:
            outcome(d)

    else:

        @app.listener(Queue(queue, quorum=True), retry=RETRY)
        async def ah(d: AsyncDelivery) -> None:
            outcome(d)

    return app


def ready(cluster: ClusterHandle, via: int, queue: str) -> int:
    try:
        return cluster[via].counts(queue).ready
    except BrokerError:  # a queue whose leader a node cannot reach just now
        return -1


@pytest.mark.parametrize("app_cls", [App, AsyncApp])
def test_delayed_retries_survive_the_loss_of_the_delay_queues_leader(
    rabbitmq_cluster: ClusterHandle, queue_factory: QueueFactory, app_cls: type
) -> None:
    cluster = rabbitmq_cluster
    queue = queue_factory("qretry", broker=cluster[0])
    delay, dlq = f"{queue}.{FIRST_TIER}", f"{queue}.dlq"
    calls: Counter[str] = Counter()
    done: set[str] = set()

    # ackkit declares its queues (through node 0); the delay queue's leader is where the
    # broker put it, and the app then runs on the two other nodes
    first = make_app(app_cls, cluster.urls, queue, Counter(), set())
    r = Runner(first)
    r.start()
    r.stop()
    for name in (queue, delay, dlq):
        assert cluster.quorum_status(name).members == tuple(sorted(cluster.node_names))
    victim = cluster.index_of(cluster.quorum_status(delay).leader)
    others = [i for i in range(len(cluster)) if i != victim]
    via = others[-1]

    # all published before the app consumes: published one by one beside it, the first
    # messages left the 5 s delay queue before the last arrived (seen once under load)
    publish(cluster, via, queue, MESSAGES)
    app = make_app(app_cls, [cluster.url(i) for i in others], queue, calls, done)
    runner = Runner(app)
    runner.start()
    killed_at = 0.0
    try:
        # every message failed once and waits in the 5 s delay queue
        assert wait_until(lambda: ready(cluster, via, delay) == MESSAGES, timeout=30), ready(
            cluster, via, delay
        )
        all_waiting = time.monotonic()
        cluster.kill(victim)
        killed_at = time.monotonic()
        leader = cluster.wait_leader(delay, via=via, not_on=cluster.node_names[victim])
        elected = time.monotonic() - killed_at
        goods = {f"m{i}" for i in range(MESSAGES) if not poison(f"m{i}")}
        assert wait_until(lambda: done >= goods, timeout=90, interval=0.2), (
            f"{len(goods - done)} not handled; {delay}: {ready(cluster, via, delay)}"
        )

        def settled() -> bool:
            try:
                c = [cluster[via].counts(n) for n in (queue, delay, f"{queue}.retry.10000ms")]
                return all(x.ready == 0 and x.unacked == 0 for x in c) and (
                    cluster[via].counts(dlq).ready >= MESSAGES // 2
                )
            except BrokerError:
                return False

        assert wait_until(settled, timeout=90, interval=0.2), [
            (n, ready(cluster, via, n)) for n in (queue, delay, dlq)
        ]
        recovered = time.monotonic() - killed_at
        assert runner.alive()
    finally:
        runner.stop()
        if killed_at:
            cluster.start(victim)  # back for the queue's cleanup and the next test
    # the DLQ, read through a survivor: exactly the poison messages, each with its reason
    letters = inspect_dead_letters(cluster.url(via), dlq)
    ids = Counter(str(x.message_id) for x in letters)
    poisons = {f"m{i}" for i in range(MESSAGES) if poison(f"m{i}")}
    assert set(ids) == poisons
    for letter in letters:
        assert "attempts exhausted" in letter.reason and letter.attempts == 3, letter
        assert letter.error_type == "RuntimeError" and letter.original_queue == queue
    assert done == goods
    assert cluster[via].counts(queue).total == 0
    doubled = sum(1 for n in ids.values() if n > 1)
    print(
        f"{app_cls.__name__} on {cluster.version}: {MESSAGES} messages in {FIRST_TIER}, "
        f"its leader's node ({cluster.node_names[victim]}) killed "
        f"{killed_at - all_waiting:.1f} s after the last arrived; new leader {leader} after "
        f"{elected:.1f} s; all {len(goods)} retried ones acked and {len(poisons)} poison "
        f"ones in the DLQ ({doubled} twice) {recovered:.1f} s after the kill; handler "
        f"calls {sum(calls.values())}"
    )
