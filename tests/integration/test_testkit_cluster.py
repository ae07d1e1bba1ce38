"""The test kit's RabbitMQ cluster: three nodes of the kit's own, joined, and the
faults it can put on them (SIGKILL, clean stop and start, SIGSTOP past the net tick
time), of the version the leg asks for (``ACKKIT_TEST_RABBITMQ``): the machine's
RabbitMQ 3.10, or 4.3 in a Debian root (as root; make test's 4.3 leg runs this module).

Everything is asserted from the brokers themselves: the running nodes each node
reports (``rabbitmqctl cluster_status``), a quorum queue's members and leader
(``rabbitmqctl list_queues``), and messages published through one node and taken
through another. The command (``python -m ackkit_testkit._cluster``) leaves no node
behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pika
import pytest

from ackkit.testing import BrokerHandle
from ackkit.testing.plugin import QueueFactory
from ackkit_testkit import ClusterHandle
from ackkit_testkit._proc import iter_processes

pytestmark = pytest.mark.integration

PERSISTENT = pika.BasicProperties(delivery_mode=2)


@contextlib.contextmanager
def channel(broker: BrokerHandle) -> Iterator[Any]:
    conn = broker.connect(connection_attempts=1, socket_timeout=10, stack_timeout=15)
    try:
        yield conn.channel()
    finally:
        with contextlib.suppress(Exception):
            conn.close()


def declare_quorum(broker: BrokerHandle, queue: str) -> None:
    """A quorum queue whose leader is the node it is declared through."""
    args = {"x-queue-type": "quorum", "x-queue-leader-locator": "client-local"}
    with channel(broker) as ch:
        ch.queue_declare(queue, durable=True, arguments=args)


def publish(broker: BrokerHandle, queue: str, body: bytes) -> None:
    """Publish one persistent message with a publisher confirm (so the queue has it)."""
    with channel(broker) as ch:
        ch.confirm_delivery()
        ch.basic_publish("", queue, body, PERSISTENT, mandatory=True)


def take_all(broker: BrokerHandle, queue: str, timeout: float = 90.0) -> list[bytes]:
    """Take (get and ack) every ready message of ``queue`` through ``broker``, once it
    serves the queue. A node back from a freeze (or restarted by autoheal) reports itself
    running before its member of the queue has caught up: until then a get through it
    fails with 541 INTERNAL_ERROR ("Cannot get a message from queue ... timeout", seen on
    4.3 under load). What was taken and acked before such a failure is kept."""
    bodies: list[bytes] = []
    deadline = time.monotonic() + timeout
    while True:
        try:
            with channel(broker) as ch:
                while True:
                    method, _props, body = ch.basic_get(queue, auto_ack=False)
                    if method is None:
                        return bodies
                    ch.basic_ack(method.delivery_tag)
                    bodies.append(body)
        except pika.exceptions.ConnectionClosedByBroker as exc:
            if exc.reply_code != 541:
                raise
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"{queue} not served through that node within {timeout:.0f} s "
                    f"of the node running again: {exc}"
                ) from exc
            time.sleep(1)


def test_three_nodes_run_joined(rabbitmq_cluster: ClusterHandle) -> None:
    cluster = rabbitmq_cluster
    names = sorted(cluster.node_names)
    assert len(set(names)) == 3
    assert len({node.amqp_port for node in cluster.nodes}) == 3
    for index in range(3):
        assert cluster.running_nodes(via=index) == names  # what each node itself reports
        assert cluster.url(index) == cluster.nodes[index].url
    assert sorted(cluster.cluster_status()["disk_nodes"]) == names
    series = cluster.version
    for node in cluster.nodes:
        assert node.server_version().startswith(series + ".")


def test_quorum_queue_spans_the_nodes(
    rabbitmq_cluster: ClusterHandle, queue_factory: QueueFactory
) -> None:
    cluster = rabbitmq_cluster
    queue = queue_factory("qq", broker=cluster[0])
    declare_quorum(cluster[0], queue)
    status = cluster.quorum_status(queue, via=2)
    assert status.members == tuple(sorted(cluster.node_names))
    assert status.leader == cluster.node_names[0]
    publish(cluster[0], queue, b"via node 0")
    assert take_all(cluster[2], queue) == [b"via node 0"]


def test_killed_node_hands_over_and_rejoins(
    rabbitmq_cluster: ClusterHandle, queue_factory: QueueFactory
) -> None:
    cluster = rabbitmq_cluster
    first = cluster.node_names[0]
    queue = queue_factory("kill", broker=cluster[1])
    declare_quorum(cluster[0], queue)
    status = cluster.quorum_status(queue)
    assert status.leader == first and len(status.members) == 3
    publish(cluster[0], queue, b"before the kill")

    cluster.kill(0)
    assert not cluster.is_running(0)
    assert cluster.wait_running(2) == sorted(cluster.node_names[1:])
    leader = cluster.wait_leader(queue, via=1, not_on=first)
    assert leader in cluster.node_names[1:]
    publish(cluster[1], queue, b"after the kill")
    assert take_all(cluster[2], queue) == [b"before the kill", b"after the kill"]

    cluster.start(0)
    assert cluster.wait_running() == sorted(cluster.node_names)
    assert cluster.running_nodes(via=0) == sorted(cluster.node_names)
    # and its replica of the queue runs again: 3 members online, as node 0 itself reports
    deadline = time.monotonic() + 60
    while (online := cluster.quorum_status(queue, via=0).online) != status.members:
        assert time.monotonic() < deadline, f"online: {online}"
        time.sleep(0.2)


def test_stopped_node_starts_again(rabbitmq_cluster: ClusterHandle) -> None:
    cluster = rabbitmq_cluster
    cluster.stop(1)
    assert not cluster.is_running(1)
    assert cluster.wait_running(2) == sorted([cluster.node_names[0], cluster.node_names[2]])
    cluster.start(1)
    assert cluster.wait_running() == sorted(cluster.node_names)


def test_frozen_node_is_left_behind_then_comes_back(
    rabbitmq_cluster: ClusterHandle, queue_factory: QueueFactory
) -> None:
    cluster = rabbitmq_cluster
    frozen = cluster.node_names[2]
    queue = queue_factory("freeze", broker=cluster[0])
    declare_quorum(cluster[2], queue)
    assert cluster.quorum_status(queue).leader == frozen

    started = time.monotonic()
    with cluster.frozen(2):
        # the others see it gone once the net tick time has passed, not before
        others = cluster.wait_running(2, timeout=cluster.net_ticktime * 3 + 10)
        seen_gone = time.monotonic() - started
        assert others == sorted(cluster.node_names[:2])
        leader = cluster.wait_leader(queue, via=0, not_on=frozen)
        assert leader in cluster.node_names[:2]
        publish(cluster[0], queue, b"while node 2 was frozen")
    assert seen_gone > cluster.net_ticktime * 0.75 - 1
    # thawed: the nodes meet again, autoheal restarts the node that was cut off, and all
    # three run together (3.10 may still record the partition on a node: the fixture
    # restarts it before the next test)
    assert cluster.wait_running(timeout=120) == sorted(cluster.node_names)
    assert take_all(cluster[2], queue) == [b"while node 2 was frozen"]


def _left_behind(owner: int, epmd_port: int | None) -> list[tuple[int, str]]:
    """Processes of the command's cluster: its nodes' VMs (tagged with the pid that owns
    them) and the epmd its 4.x nodes share."""
    tags = [f"-ackkit_owner {owner} "]
    if epmd_port is not None:
        tags.append(f"epmd -port {epmd_port} ")
    return [(pid, cmd) for pid, cmd in iter_processes() if any(t in cmd + " " for t in tags)]


def test_command_runs_a_cluster_and_leaves_nothing(rabbitmq_cluster_version: str) -> None:
    """``python -m ackkit_testkit._cluster`` prints the nodes once the cluster is up and,
    on SIGTERM, kills them all (two nodes here: the command's own cluster runs beside the
    fixture's on a small machine)."""
    with subprocess.Popen(
        [sys.executable, "-m", "ackkit_testkit._cluster", "--json", "--nodes", "2"],
        env={**os.environ, "ACKKIT_TEST_RABBITMQ": rabbitmq_cluster_version},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as proc:
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            if not line:
                _out, err = proc.communicate(timeout=60)
                pytest.fail(f"the command printed no cluster (exit {proc.returncode}):\n{err}")
            info = json.loads(line)
            assert info["rabbitmq"] == rabbitmq_cluster_version
            assert len(info["urls"]) == 2 and len(set(info["nodes"])) == 2
            running = _left_behind(proc.pid, info["epmd_port"])
            assert len(running) >= 2, running  # a VM per node (and the shared epmd on 4.x)
            for url in info["urls"]:
                pika.BlockingConnection(pika.URLParameters(url)).close()
            proc.send_signal(signal.SIGTERM)
            proc.communicate(timeout=60)
            assert proc.returncode == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    assert _left_behind(proc.pid, info["epmd_port"]) == []
