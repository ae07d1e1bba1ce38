"""Helpers shared by the examples: a broker, publishing, and the seeds' queue table."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol

import ackkit


class Broker(Protocol):
    """What an example needs of a broker (ackkit.testing.BrokerHandle fits)."""

    @property
    def url(self) -> str: ...

    def counts(self, queue: str) -> Any: ...

    def server_version(self) -> str: ...

    def delete(self, queue: str) -> None: ...


@contextlib.contextmanager
def broker_for_cli() -> Iterator[Broker]:
    """AMQP_URL if set, else Docker, else a throwaway local node (as the test kit does)."""
    from ackkit.testing import provision_broker

    with provision_broker() as b:
        yield b


def publish_json(url: str, queue: str, items: Iterable[Any], **kw: Any) -> int:
    n = 0
    with ackkit.connect(url) as c:
        c.declare_queue(queue)
        for i, item in enumerate(items):
            body = item if isinstance(item, bytes) else json.dumps(item)
            c.publish(queue, body, message_id=kw.pop("message_id", None) or f"{queue}-{i}", **kw)
            n += 1
    return n


def table(broker: Broker, queues: Iterable[str], title: str = "") -> dict[str, tuple[int, int]]:
    """Print `rabbitmqctl list_queues name messages_ready messages_unacknowledged`-style rows."""
    rows: dict[str, tuple[int, int]] = {}
    if title:
        print(f"  {title}")
    print(f"    {'queue':<40} {'ready':>6} {'unacked':>8}")
    for q in queues:
        try:
            c = broker.counts(q)
            rows[q] = (c.ready, c.unacked)
        except Exception:
            rows[q] = (-1, -1)
        r, u = rows[q]
        print(f"    {q:<40} {r:>6} {u:>8}")
    return rows


def wait_for(pred: Callable[[], bool], timeout: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.05)
    return pred()


def settled(broker: Broker, queue: str, ready: int = 0, unacked: int = 0) -> bool:
    def ok() -> bool:
        c = broker.counts(queue)
        return bool(c.ready == ready and c.unacked == unacked)

    return wait_for(ok)


def cleanup(broker: Broker, *queues: str) -> None:
    for q in queues:
        with contextlib.suppress(Exception):
            broker.delete(q)
