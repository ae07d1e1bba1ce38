"""The tools given all three node addresses of the test kit's cluster: `ackkit dlq
inspect` (the comma form) and `ackkit queues` (AMQP_URL, URLs separated by spaces)
answer with the first node down, and `ackkit outbox relay` keeps relaying after the
node it talks to (the first address) is killed.

One module, so that both share one cluster (starting one takes about a minute). The
queues are quorum queues led by node 1 (declared there, leader client-local): what is
tested is the tool's connection moving off node 0, not a queue's leader election
(tests/integration/test_cluster_failover.py covers that for apps). Everything is read
from the brokers: the tool's connection (the node's list of connections), the queues'
messages, the outbox table.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time

import psycopg
import pytest
from _cluster_support import connection_ports
from _retry_support import wait_until
from typer.testing import CliRunner

from ackkit.cli import build_cli
from ackkit.inbox import SCHEMA, enqueue
from ackkit.testing.plugin import QueueFactory
from ackkit_testkit import ClusterHandle

pytestmark = pytest.mark.integration


def quorum_queue(cluster: ClusterHandle, queue: str, via: int = 1) -> None:
    """Declare `queue` as a quorum queue led by node `via`."""
    conn = cluster[via].connect(connection_attempts=1, socket_timeout=10, stack_timeout=15)
    try:
        args = {"x-queue-type": "quorum", "x-queue-leader-locator": "client-local"}
        conn.channel().queue_declare(queue, durable=True, arguments=args)
    finally:
        conn.close()
    assert cluster.quorum_status(queue, via=via).leader == cluster.node_names[via]


def publish(cluster: ClusterHandle, queue: str, ids: list[str], via: int = 1) -> None:
    import pika

    conn = cluster[via].connect(connection_attempts=1, socket_timeout=10, stack_timeout=15)
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        for m in ids:
            props = pika.BasicProperties(delivery_mode=2, message_id=m)
            ch.basic_publish("", queue, b"{}", props, mandatory=True)
    finally:
        conn.close()


def take_ids(cluster: ClusterHandle, queue: str, via: int = 2) -> list[str]:
    """Every message id in `queue`, taken (acked), as node `via` delivers them."""
    conn = cluster[via].connect(connection_attempts=1, socket_timeout=10, stack_timeout=15)
    out = []
    try:
        ch = conn.channel()
        while True:
            method, props, _body = ch.basic_get(queue, auto_ack=True)
            if method is None:
                return out
            out.append(str(props.message_id))
    finally:
        conn.close()


def test_cli_given_three_addresses_with_the_first_node_down(
    rabbitmq_cluster: ClusterHandle, queue_factory: QueueFactory
) -> None:
    cluster = rabbitmq_cluster
    dlq = queue_factory("tools-dlq", broker=cluster[2])  # cleaned up through a survivor
    quorum_queue(cluster, dlq)
    ids = [f"d{i}" for i in range(5)]
    publish(cluster, dlq, ids)
    cluster.kill(0)
    assert not cluster.is_running(0)
    runner = CliRunner()

    # the comma form (a single --url; repeating --url is the unit tests': given one
    # after the other, a command that kept only the last --url would pass here too)
    ports = ",".join(f"127.0.0.1:{cluster[i].amqp_port}" for i in range(3))
    comma = f"amqp://guest:guest@{ports}/%2f"
    started = time.monotonic()
    res = runner.invoke(build_cli(), ["dlq", "inspect", dlq, "--format", "json", "--url", comma])
    took = time.monotonic() - started
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["count"] == 5
    assert [m["message_id"] for m in data["messages"]] == ids  # read and put back

    # AMQP_URL holding the three URLs separated by spaces, on another command
    args = ["queues", dlq, "--source", "amqp", "--format", "json"]
    res = runner.invoke(build_cli(), args, env={"AMQP_URL": " ".join(cluster.urls)})
    assert res.exit_code == 0, res.output
    listing = json.loads(res.stdout)
    assert [(q["name"], q["ready"]) for q in listing["queues"]] == [(dlq, 5)]
    assert listing["url"] == ", ".join(cluster.urls).replace("guest:guest@", "guest:***@")
    print(f"dlq inspect with node 0 down answered in {took:.2f} s")


def write(dsn: str, queue: str, ids: list[str]) -> None:
    with psycopg.connect(dsn) as conn:
        with conn.transaction():
            conn.execute(SCHEMA)
        with conn.transaction():
            for m in ids:
                enqueue(conn, queue, {"id": m}, message_id=m)


def outbox_rows(dsn: str) -> int:
    with psycopg.connect(dsn) as c:
        row = c.execute("SELECT count(*) FROM ackkit_outbox").fetchone()
        return int(row[0]) if row else 0


def test_outbox_relay_keeps_relaying_after_its_node_is_killed(
    rabbitmq_cluster: ClusterHandle, queue_factory: QueueFactory, postgres_dsn: str
) -> None:
    """`ackkit outbox relay --url <the comma form>` as a process of its own, its node
    (node 0, the first address) SIGKILLed between two batches of rows."""
    cluster = rabbitmq_cluster
    queue = queue_factory("tools-relay", broker=cluster[2])
    quorum_queue(cluster, queue)
    before = [f"b{i}" for i in range(100)]
    after = [f"a{i}" for i in range(100)]
    write(postgres_dsn, queue, before)

    ports = ",".join(f"127.0.0.1:{cluster[i].amqp_port}" for i in range(3))
    comma = f"amqp://guest:guest@{ports}/%2f"
    cmd = [sys.executable, "-m", "ackkit.cli", "outbox", "relay", "--poll", "0.1"]
    proc = subprocess.Popen(
        [*cmd, "--url", comma, "--dsn", postgres_dsn],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert wait_until(lambda: outbox_rows(postgres_dsn) == 0, timeout=30)
        # the relay's connection is on node 0, the first address
        node0 = [cluster[0].amqp_port]
        assert wait_until(lambda: connection_ports(cluster, "ackkit-pull", 2) == node0, 30), (
            connection_ports(cluster, "ackkit-pull", 2)
        )
        killed_at = time.monotonic()
        cluster.kill(0)
        write(postgres_dsn, queue, after)
        assert wait_until(lambda: outbox_rows(postgres_dsn) == 0, timeout=60), (
            f"{outbox_rows(postgres_dsn)} rows left in the outbox"
        )
        relayed = time.monotonic() - killed_at
        node1 = [cluster[1].amqp_port]
        assert wait_until(lambda: connection_ports(cluster, "ackkit-pull", 2) == node1, 30), (
            connection_ports(cluster, "ackkit-pull", 2)
        )
        assert proc.poll() is None
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    shown = ", ".join(u.replace("guest:guest@", "guest:***@") for u in cluster.urls)
    assert f"outbox relay to {shown} from" in err
    assert re.search(r"outbox relay stopped: (\d+) sent", err), err
    got = take_ids(cluster, queue)
    assert set(got) == set(before) | set(after)  # nothing lost
    twice = len(got) - len(set(got))  # sent again: unconfirmed when the node died
    print(
        f"relay: {len(set(got))} messages, {twice} twice; the outbox empty {relayed:.1f} s "
        "after node 0 was killed, the relay on node 1"
    )
