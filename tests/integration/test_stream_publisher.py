"""StreamPublisher: a republished batch after a producer crash is stored once.

The "crash" is real: a child process publishes through StreamPublisher and is
SIGKILLed right after the broker confirmed its batch, before it could record how far it
got; the restarted producer publishes the whole batch again with the same publishing
ids. What the stream holds is read back with plain rstream.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("rstream")

from ackkit.streams import StreamMessage, StreamPublisher
from tests._streams import (
    declare_stream,
    declare_super_stream,
    delete_queues,
    message_ids,
    version_of,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

CHILD = """
import os, signal, sys
from ackkit.streams import StreamMessage, StreamPublisher
url, port, stream, n = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
pub = StreamPublisher(url, stream=stream, name="exporter", stream_port=port)
pub.publish([(i + 1, StreamMessage(b"x", message_id=f"m-{i}")) for i in range(n)])
os.kill(os.getpid(), signal.SIGKILL)  # confirmed, and gone before recording it
"""


def _batch(n: int, first: int = 0) -> list[tuple[int, StreamMessage]]:
    return [(i + 1, StreamMessage(b"x", message_id=f"m-{i}")) for i in range(first, n)]


def test_republished_batch_after_a_crash_is_not_duplicated(stream_broker: Any) -> None:
    node = stream_broker
    stream = f"pub-{secrets.token_hex(3)}"
    declare_stream(node.url, stream)
    try:
        root = str(Path(__file__).resolve().parents[2])
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]),
        }
        proc = subprocess.run(
            [sys.executable, "-c", CHILD, node.url, str(node.stream_port), stream, "300"],
            env=env,
            capture_output=True,
            timeout=120,
        )
        assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-2000:]
        assert len(message_ids(node.url, node.stream_port, stream)) == 300

        with StreamPublisher(
            node.url, stream=stream, name="exporter", stream_port=node.stream_port
        ) as pub:
            assert pub.last_publishing_id() == 300  # the broker remembers the name's ids
            # the restarted producer does not know: it publishes everything again, and more
            assert pub.publish(_batch(450)) == 450  # all confirmed, duplicates included
        ids = message_ids(node.url, node.stream_port, stream)
        assert sorted(ids) == sorted(f"m-{i}" for i in range(450))
        # another name is another producer: not deduplicated against "exporter"
        with StreamPublisher(
            node.url, stream=stream, name="other", stream_port=node.stream_port
        ) as pub:
            assert pub.last_publishing_id() == 0
            pub.publish(_batch(1))
        assert len(message_ids(node.url, node.stream_port, stream)) == 451
    finally:
        delete_queues(node.url, stream)


def test_super_stream_publisher_routes_and_deduplicates(stream_broker: Any) -> None:
    node = stream_broker
    if version_of(node.url) < (3, 11):
        pytest.skip("super streams need RabbitMQ 3.11+ (they run on the 4.3 leg)")
    name = f"pubss-{secrets.token_hex(3)}"
    parts = declare_super_stream(node.url, name, 3)
    try:
        with StreamPublisher(
            node.url, super_stream=name, name="exporter", stream_port=node.stream_port
        ) as pub:
            assert pub.partitions == parts
            pub.publish(_batch(200))
            pub.publish(_batch(260, first=100))  # 100..199 again, then 60 new
        per = {p: message_ids(node.url, node.stream_port, p) for p in parts}
        everything = [m for ids in per.values() for m in ids]
        assert sorted(everything) == sorted(f"m-{i}" for i in range(260))
        assert all(len(ids) > 30 for ids in per.values())  # routed over all partitions
    finally:
        delete_queues(node.url, *parts)
