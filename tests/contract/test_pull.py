"""Pull mode settles through the listeners' executors: what a get or a settle decided
is carried out before the call returns, a dead letter's copy confirmed by the broker.

Both pull connections, on RabbitMQ and the in-memory broker. A dead-letter queue's
count is read right after the call returned, without waiting: the call returned after
the broker's confirm, so the copy is in that queue. Acks have no confirm: what they
settle is waited for.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Generator
from typing import Any

import pytest

import ackkit
from ackkit._core import headers as H
from ackkit.testing import QueueNotFound

from .conftest import Broker

Script = Callable[[Any], Generator[Any, Any, None]]
Driver = Callable[[Broker, Script], None]


async def _drive(steps: Generator[Any, Any, None], awaited: bool) -> None:
    """Run a script: each value it yields is the result of its call (sync), or the
    call's coroutine, awaited here (async); the script goes on right after, with
    nothing in between (it reads the counts then)."""
    result = None
    while True:
        try:
            call = steps.send(result)
        except StopIteration:
            return
        result = await call if awaited else call


def _sync(broker: Broker, script: Script) -> None:
    with ackkit.connect(broker.handle.url) as conn:
        asyncio.run(_drive(script(_Pull(conn, broker, asynchronous=False)), awaited=False))


def _async(broker: Broker, script: Script) -> None:
    async def run() -> None:
        async with ackkit.aconnect(broker.handle.url) as conn:
            await _drive(script(_Pull(conn, broker, asynchronous=True)), awaited=True)

    asyncio.run(run())


class _Pull:
    """The calls a script makes, on either connection (a coroutine on the async one)."""

    def __init__(self, conn: Any, broker: Broker, *, asynchronous: bool) -> None:
        self.conn = conn
        self.handle = broker.handle
        self.asynchronous = asynchronous

    def declare(self, q: str) -> Any:
        return self.conn.declare_queue(q)

    def get(self, q: str) -> Any:
        return self.conn.get(q)

    def settle(self, d: Any, kind: str, **kw: Any) -> Any:
        return getattr(d, kind)(**kw)

    def wait_for(self, q: str, **want: int) -> Any:
        """The broker's counts of `q` reach `want` (awaited on the loop: the async
        connection's frames are written by a task of that loop)."""
        if self.asynchronous:
            return self.handle.wait_for_async(q, timeout=30.0, **want)
        return self.handle.wait_for(q, timeout=30.0, **want)


PULLS = {"connect": _sync, "aconnect": _async}


@pytest.fixture(params=sorted(PULLS))
def pull(
    request: pytest.FixtureRequest,
) -> Driver:
    return PULLS[request.param]


def test_a_dead_letter_is_confirmed_when_the_settle_returns(
    pull: Driver, broker: Broker, queue_factory: Any
) -> None:
    q = queue_factory()
    dlq = f"{q}.dlq"

    def script(p: Any) -> Generator[Any, Any, None]:
        yield p.declare(q)
        broker.handle.publish(q, b"one")
        broker.handle.publish(q, b"two")
        d = yield p.get(q)
        yield p.settle(d, "reject", requeue=False)
        assert broker.counts(dlq).ready == 1
        d = yield p.get(q)
        yield p.settle(d, "nack", requeue=False)
        assert broker.counts(dlq).ready == 2
        yield p.wait_for(q, ready=0, unacked=0)  # the originals' acks (no confirm)

    pull(broker, script)
    dead = broker.handle.dead_letters(dlq)
    assert [m.body for m in dead] == [b"one", b"two"]
    assert all(m.headers[H.ORIGINAL_QUEUE] == q for m in dead)
    assert all("without requeue by handler" in m.headers[H.REASON] for m in dead)


def test_get_dead_letters_a_forged_attempt_header_and_returns_the_next(
    pull: Driver, broker: Broker, queue_factory: Any
) -> None:
    q = queue_factory()

    def script(p: Any) -> Generator[Any, Any, None]:
        yield p.declare(q)
        broker.handle.publish(q, b"forged", headers={H.ATTEMPT: "many"})
        broker.handle.publish(q, b"good")
        d = yield p.get(q)
        assert d.body == b"good"
        assert broker.counts(f"{q}.dlq").ready == 1  # confirmed before get() returned
        yield p.settle(d, "ack")
        yield p.wait_for(q, ready=0, unacked=0)
        assert (yield p.get(q)) is None

    pull(broker, script)
    (dead,) = broker.handle.dead_letters(f"{q}.dlq")
    assert dead.body == b"forged"


def test_requeue_and_ack_reach_the_broker(pull: Driver, broker: Broker, queue_factory: Any) -> None:
    q = queue_factory()

    def script(p: Any) -> Generator[Any, Any, None]:
        yield p.declare(q)
        broker.handle.publish(q, b"m")
        d = yield p.get(q)
        yield p.settle(d, "nack", requeue=True)
        yield p.wait_for(q, ready=1, unacked=0)
        d = yield p.get(q)
        assert d.body == b"m" and d.redelivered
        yield p.settle(d, "ack")
        yield p.wait_for(q, ready=0, unacked=0)
        assert (yield p.get(q)) is None

    pull(broker, script)


def test_get_declares_no_dead_letter_queue_until_a_dead_letter_needs_it(
    pull: Driver, broker: Broker, queue_factory: Any
) -> None:
    """get(q) declared q.dlq at once, unasked; now the broker has no q.dlq until the
    first dead letter of q, which declares it and lands there."""
    q = queue_factory()
    dlq = f"{q}.dlq"

    def missing(name: str) -> bool:
        try:
            broker.handle.counts(name)
        except QueueNotFound:
            return True
        return False

    def script(p: Any) -> Generator[Any, Any, None]:
        yield p.declare(q)
        broker.handle.publish(q, b"one")
        broker.handle.publish(q, b"two")
        d = yield p.get(q)
        yield p.settle(d, "ack")
        yield p.wait_for(q, ready=1, unacked=0)
        assert missing(dlq), "get() declared the dead-letter queue"
        d = yield p.get(q)
        yield p.settle(d, "reject", requeue=False)
        assert broker.counts(dlq).ready == 1  # declared with the copy, confirmed

    pull(broker, script)
    assert [m.body for m in broker.handle.dead_letters(dlq)] == [b"two"]
