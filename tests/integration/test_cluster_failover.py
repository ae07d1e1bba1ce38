"""An App and an AsyncApp given all three node addresses of the test kit's cluster keep
consuming through the loss of the node they are connected to.

Each runtime's listener consumes a quorum queue whose leader is on node 0, the node the
app connects to first (the addresses are tried in the given order). Node 0 is SIGKILLed
while messages are in flight; the app reconnects to the next address (node 1), and
every message published before and after the kill is handled and acked: the broker
ends with the queue empty, nothing unacked, and one consumer (the app's), and the
app's connection is on another node. Everything is read from the brokers
(the node's list of connections, the queue's counts). On 4.x the queue's
``x-consumer-disconnected-timeout`` is 5 s: the broker holds the messages the dead
node's consumer had for that long before it delivers them again (its default is longer
than the test's minute).

Pull connections given a dead address first connect to the next one, and take the
addresses in order again after the broker closes their connection.
"""

from __future__ import annotations

import socket
import threading
import time
from collections import Counter
from typing import Any

import pika
import pytest
from _apps import Runner
from _cluster_support import connection_ports
from _retry_support import wait_until

from ackkit import App, AsyncApp, AsyncDelivery, Delivery, Queue
from ackkit.testing import BrokerError, BrokerHandle
from ackkit.testing.plugin import QueueFactory
from ackkit_testkit import ClusterHandle

pytestmark = pytest.mark.integration

BEFORE = 300
AFTER = 200
NAME = "ackkit-failover-test"
HELD_MS = 5000


def publish(broker: BrokerHandle, queue: str, ids: range) -> None:
    """Publish persistent messages, each with a confirm, through one node."""
    conn = broker.connect(connection_attempts=1, socket_timeout=10, stack_timeout=15)
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        for i in ids:
            props = pika.BasicProperties(delivery_mode=2, message_id=f"m{i}")
            ch.basic_publish("", queue, b"{}", props, mandatory=True)
    finally:
        conn.close()


def app_ports(cluster: ClusterHandle, via: int) -> list[int]:
    """The server ports of the app's connections, as node `via` lists them (every
    node's connections)."""
    ports = connection_ports(cluster, NAME, via)
    if isinstance(ports, str):
        raise BrokerError(ports)
    return ports


def wait_on_node(cluster: ClusterHandle, index: int, via: int) -> None:
    """Wait until the app has one connection, on node `index` (as node `via` lists
    the cluster's connections)."""
    ports: list[int] | str = []

    def there() -> bool:
        nonlocal ports
        try:
            ports = app_ports(cluster, via)
        except BrokerError as exc:  # a node just killed may fail the listing once
            ports = str(exc)[:300]
            return False
        return ports == [cluster[index].amqp_port]

    assert wait_until(there, timeout=30, interval=0.1), f"the app's connections: {ports}"


@pytest.mark.parametrize("app_cls", [App, AsyncApp])
def test_listener_fails_over_to_another_node(
    rabbitmq_cluster: ClusterHandle, queue_factory: QueueFactory, app_cls: type
) -> None:
    cluster = rabbitmq_cluster
    queue = queue_factory("failover", broker=cluster[2])  # cleaned up through a survivor
    conn = cluster[0].connect(connection_attempts=1, socket_timeout=10, stack_timeout=15)
    try:
        args: dict[str, Any] = {
            "x-queue-type": "quorum",
            "x-queue-leader-locator": "client-local",
        }
        if not cluster.version.startswith("3."):
            # 4.x holds the messages a consumer on an unreachable node had (they may
            # still be acked if the node comes back) for consumer_disconnected_timeout:
            # kept short here, the wait is the broker's, not ackkit's
            args["x-consumer-disconnected-timeout"] = HELD_MS
        conn.channel().queue_declare(queue, durable=True, arguments=args)
    finally:
        conn.close()
    assert cluster.quorum_status(queue).leader == cluster.node_names[0]
    publish(cluster[0], queue, range(BEFORE))

    handled: Counter[str] = Counter()
    lock = threading.Lock()
    app = app_cls(
        cluster.urls,  # node 0 first
        connection_name=NAME,
        heartbeat=5,
        reconnect_max_interval=1.0,
        startup_timeout=30,
    )
    if app_cls is App:

        @app.listener(Queue(queue, declare=False), dead_letter=None)
        def h(d: Delivery) -> None:
            time.sleep(0.01)  # messages are in flight when the node dies
            with lock:
                handled[str(d.message_id)] += 1

    else:

        @app.listener(Queue(queue, declare=False), dead_letter=None)
        async def ah(d: AsyncDelivery) -> None:
            import asyncio

            await asyncio.sleep(0.01)
            with lock:
                handled[str(d.message_id)] += 1

    runner = Runner(app)
    runner.start()
    try:
        wait_on_node(cluster, 0, via=2)  # the first address
        assert wait_until(lambda: len(handled) >= 30, timeout=30)
        killed_at = time.monotonic()
        cluster.kill(0)
        # the app's connection moves to the next address (node 1)
        wait_on_node(cluster, 1, via=2)
        reconnected = time.monotonic() - killed_at
        # publishing waits for the queue's new leader (until then the broker nacks)
        cluster.wait_leader(queue, via=2, not_on=cluster.node_names[0])
        publish(cluster[2], queue, range(BEFORE, BEFORE + AFTER))
        every = {f"m{i}" for i in range(BEFORE + AFTER)}
        assert wait_until(lambda: set(handled) >= every, timeout=60), (
            f"not handled: {len(every - set(handled))}; {cluster[2].counts(queue)}"
        )
        resumed = time.monotonic() - killed_at
        assert set(handled) == every  # nothing else either
        wait_on_node(cluster, 1, via=2)  # and it stayed there
        # the broker: every message acked, and the listener consumes (not left with none)
        assert wait_until(
            lambda: (
                (c := cluster[2].counts(queue)).ready == 0 and c.unacked == 0 and c.consumers == 1
            ),
            timeout=30,
        ), cluster[2].counts(queue)
        assert runner.alive()
    finally:
        runner.stop()
    doubled = sum(1 for n in handled.values() if n > 1)
    print(
        f"{app_cls.__name__}: {len(every)} handled, {doubled} twice (redelivered after "
        f"the kill); on node 1 {reconnected:.1f} s after the kill, all handled after "
        f"{resumed:.1f} s (the queue's new leader waited for, {AFTER} more published)"
    )


def closed_port() -> int:
    """A loopback port nothing listens on (a node that is down)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def retried(call: Any) -> Any:
    """`call()`, again (up to 3 times) when it meets the connection the broker closed."""
    for tries_left in (2, 1, 0):
        try:
            return call()
        except Exception as exc:
            if not tries_left:
                raise
            print(f"get after the close: {exc!r}")


def test_pull_connections_take_the_next_address(
    rabbitmq_cluster: ClusterHandle, queue_factory: QueueFactory
) -> None:
    """connect() and aconnect() given a dead address first connect to the next one,
    and after their connection is closed by the broker, reconnect and go on."""
    import asyncio

    import ackkit.pull

    cluster = rabbitmq_cluster
    queue = queue_factory("pull", broker=cluster[1], declare=True)
    publish(cluster[1], queue, range(4))
    dead = f"amqp://guest:secret@127.0.0.1:{closed_port()}/%2f"
    urls = [dead, cluster.url(1)]
    with ackkit.pull.connect(urls) as conn:
        d = conn.get(queue, dead_letter=None)
        assert d is not None and d.message_id == "m0"
        d.ack()
        cluster[1].close_connections()
        d = retried(lambda: conn.get(queue, dead_letter=None))  # dead address, then node 1
        assert d is not None and d.message_id == "m1"
        d.ack()

    async def pull_async() -> None:
        async with ackkit.pull.aconnect(urls) as aconn:
            for expected in ("m2", "m3"):
                ad = None
                for _ in range(3):  # the call that meets the closed connection may fail
                    try:
                        ad = await aconn.get(queue, dead_letter=None)
                        break
                    except Exception as exc:
                        print(f"aconnect get after the close: {exc!r}")
                assert ad is not None and ad.message_id == expected
                await ad.ack()
                cluster[1].close_connections()

    asyncio.run(pull_async())
    assert cluster[1].counts(queue).total == 0
