"""A listener that cannot consume is never a quiet zombie (issue 20).

On a real broker, both runtimes: the listener's queue deleted under it (declared
again, or the app stops), a consume the broker refuses (no read permission: start()
fails with the broker's reason; another consumer holds the queue exclusively: a
standby that takes over when it frees), more listeners than the connection's
channel_max, and a purge mid-run. What is asserted comes from the broker: consumer
counts, queue counts, what the handlers got.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pika
import pytest
from prometheus_client import CollectorRegistry

from ackkit import Consumer, Delivery, Queue
from ackkit._connection.io import FatalConnectError
from ackkit.errors import ConsumeRefused
from ackkit.flow import FlowState
from ackkit.metrics import PrometheusMetrics
from tests._users import user as broker_user
from tests.adversarial.test_handlers import run_until
from tests.contract.conftest import IO, Broker, Runtime, eventually

pytestmark = pytest.mark.integration


class Seen:
    def __init__(self) -> None:
        self.ids: list[int] = []
        self.lock = threading.Lock()

    def behaviour(self, sleep: float = 0.0) -> Any:
        async def handle(p: dict[str, int], d: Delivery, io: IO) -> None:
            if sleep:
                await io.sleep(sleep)
            with self.lock:
                self.ids.append(p["id"])

        return handle


def bodies(n: int, start: int = 0) -> list[str | bytes]:
    return [json.dumps({"id": i}) for i in range(start, start + n)]


def start(runtime: Runtime, app: Any) -> None:
    if not runtime.is_async:
        app.start()
    else:
        runtime.lt.run(app.start())  # type: ignore[attr-defined]


def timed_stop(runtime: Runtime, app: Any) -> float:
    t = time.monotonic()
    runtime.stop(app)
    return time.monotonic() - t


def lines(caplog: pytest.LogCaptureFixture, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if text in r.getMessage()]


def test_a_deleted_queue_is_declared_again_with_its_topology_and_consumed(
    runtime: Runtime, broker: Broker, queue_factory: Any, caplog: pytest.LogCaptureFixture
) -> None:
    q = queue_factory()
    exchange = f"zombies-{uuid.uuid4().hex[:8]}"
    seen = Seen()
    caplog.set_level(logging.INFO, "ackkit")
    app = runtime.app()
    runtime.listen(app, Queue(q, bind=[(exchange, "k")]), seen.behaviour(), dict)
    try:
        with runtime.running(app):
            broker.wait_for(q, consumers=1)
            broker.publish(q, bodies(5))
            eventually(lambda: len(seen.ids) == 5)
            broker.handle.delete(q)
            broker.wait_for(q, consumers=1, timeout=15)  # it is back, with our consumer
            assert app.is_running  # type: ignore[attr-defined]
            # its binding is back too: a message through the exchange reaches it
            conn = broker.handle.connect()
            try:
                ch = conn.channel()
                ch.confirm_delivery()
                for b in bodies(5, 5):
                    ch.basic_publish(exchange, "k", b, pika.BasicProperties(delivery_mode=2))
            finally:
                conn.close()
            eventually(lambda: len(seen.ids) == 10, what="consumed after the re-declare")
            broker.wait_for(q, ready=0, unacked=0, consumers=1)
            # the dead-letter queue of its topology is there (declared with it)
            assert broker.counts(f"{q}.dlq").total == 0
            assert app.flow_state() == {app.specs[0].name: FlowState.CONSUMING}  # type: ignore[attr-defined]
        print(
            f"FIG deleted-redeclared {runtime.kind}: handled={len(seen.ids)} of 10, "
            f"log={lines(caplog, 'was deleted (')[:1] + lines(caplog, 'declared again')[:1]}"
        )
        assert sorted(seen.ids) == list(range(10))
        assert len(lines(caplog, "was deleted (")) == 1
        assert len(lines(caplog, "declared again; consuming")) == 1
        assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    finally:
        conn = broker.handle.connect()
        try:
            conn.channel().exchange_delete(exchange)
        finally:
            conn.close()


def test_a_deleted_queue_with_declare_false_stops_the_app_with_the_reason(
    runtime: Runtime, broker: Broker, queue_factory: Any, caplog: pytest.LogCaptureFixture
) -> None:
    q = queue_factory(declare=True)
    seen = Seen()
    app = runtime.app()
    runtime.listen(app, Queue(q, declare=False), seen.behaviour(), dict, dead_letter=None)
    deleted: list[float] = []

    def gone() -> bool:
        if not deleted:
            if broker.counts(q).consumers != 1:
                return False
            broker.handle.delete(q)
            deleted.append(time.monotonic())
        return not app.is_running  # type: ignore[attr-defined]

    caught = run_until(runtime, app, gone)
    took = time.monotonic() - deleted[0]
    print(
        f"FIG deleted-declare-false {runtime.kind}: stopped itself {took:.2f} s after, {caught!r}"
    )
    assert isinstance(caught, ConsumeRefused), caught
    assert "NOT_FOUND" in str(caught) and "declare=False" in str(caught)
    assert took < 30, took  # a listener that looked alive would never stop
    assert len([r for r in caplog.records if "cannot consume" in r.getMessage()]) == 1


def test_no_read_permission_fails_start_with_the_brokers_reason(
    runtime: Runtime, broker: Broker, queue_factory: Any
) -> None:
    q = queue_factory(declare=True)
    h = broker.handle
    user = f"zombie-{uuid.uuid4().hex[:8]}"
    # may configure and write everything, may read nothing
    with broker_user(h, user, "pw", configure=".*", write=".*", read="^$") as url:
        runtime.url = url
        app = runtime.app(startup_timeout=120)
        runtime.listen(app, q, Seen().behaviour(), dict, dead_letter=None)
        t = time.monotonic()
        with pytest.raises(ConsumeRefused, match="ACCESS_REFUSED") as err:
            start(runtime, app)
        print(f"FIG no-read {runtime.kind}: {time.monotonic() - t:.2f} s, {err.value}")
        assert time.monotonic() - t < 30  # promptly, not after startup_timeout (120 s)
        assert user in str(err.value) and q in str(err.value)
        assert not app.is_running  # type: ignore[attr-defined]
        assert broker.counts(q).consumers == 0


@pytest.fixture
def holder(broker: Broker) -> Iterator[Any]:
    """A connection of another client, closed at the end."""
    conns: list[Any] = []

    def make() -> Any:
        c = broker.handle.connect()
        conns.append(c)
        return c

    yield make
    for c in conns:
        if c.is_open:
            c.close()


def test_a_second_exclusive_listener_stands_by_and_takes_over(
    runtime: Runtime, broker: Broker, queue_factory: Any, caplog: pytest.LogCaptureFixture
) -> None:
    q = queue_factory(declare=True)
    first, second = Seen(), Seen()
    caplog.set_level(logging.INFO)
    if runtime.kind == "amqp10":  # no exclusive consumers over AMQP 1.0: said at start
        app = runtime.app()
        runtime.listen(app, q, first.behaviour(), dict, consumer=Consumer(exclusive=True))
        with pytest.raises(ValueError, match="single active consumer"):
            start(runtime, app)
        return
    a = runtime.app()
    runtime.listen(a, q, first.behaviour(), dict, consumer=Consumer(exclusive=True))
    b = runtime.app()
    runtime.listen(b, q, second.behaviour(), dict, consumer=Consumer(exclusive=True))
    name = b.specs[0].name  # type: ignore[attr-defined]
    with runtime.running(a):
        broker.wait_for(q, consumers=1)
        with runtime.running(b):
            assert b.flow_state() == {name: FlowState.STANDBY}  # type: ignore[attr-defined]
            broker.publish(q, bodies(20))
            eventually(lambda: len(first.ids) == 20)
            time.sleep(5)  # a standby tries every 2 s: still one line, no error
            assert broker.counts(q).consumers == 1
            assert b.is_running and not second.ids  # type: ignore[attr-defined]
            assert len(lines(caplog, "standing by")) == 1
            assert not [r for r in caplog.records if r.levelno >= logging.WARNING][1:]
            took = timed_stop(runtime, a)
            broker.publish(q, bodies(20, 20))
            eventually(lambda: len(second.ids) == 20, what="the standby took over")
            broker.wait_for(q, ready=0, unacked=0, consumers=1)
            assert b.flow_state() == {name: FlowState.CONSUMING}  # type: ignore[attr-defined]
            assert len(lines(caplog, "took over")) == 1
    print(
        f"FIG exclusive-standby {runtime.kind}: first={len(first.ids)} second={len(second.ids)} "
        f"of 40, stop of the active one {took:.2f} s, {lines(caplog, 'standing by')[:1]}"
    )
    assert sorted(first.ids + second.ids) == list(range(40))
    assert took < 5


def test_an_exclusive_consumer_of_another_client_makes_a_standby(
    runtime: Runtime, broker: Broker, queue_factory: Any, holder: Any
) -> None:
    q = queue_factory(declare=True)
    seen = Seen()
    other = holder()
    other.channel().basic_consume(q, lambda *a: None, exclusive=True)
    app = runtime.app()
    runtime.listen(app, q, seen.behaviour(), dict)
    registry = CollectorRegistry()
    PrometheusMetrics(app, registry=registry)
    with runtime.running(app):
        (state,) = app.flow_state().values()  # type: ignore[attr-defined]
        assert state is FlowState.STANDBY
        labels = {"listener": app.specs[0].name, "queue": q}  # type: ignore[attr-defined]
        assert registry.get_sample_value("ackkit_flow_state", {**labels, "state": "standby"}) == 1
        broker.publish(q, bodies(10))
        other.close()  # its unacked deliveries go back; the standby takes over
        eventually(lambda: len(seen.ids) == 10, what="the standby took over", timeout=20)
        broker.wait_for(q, ready=0, unacked=0, consumers=1)
        assert registry.get_sample_value("ackkit_flow_state", {**labels, "state": "standby"}) == 0
    print(f"FIG other-exclusive {runtime.kind}: handled={len(seen.ids)} of 10, state was standby")
    assert sorted(seen.ids) == list(range(10))


def test_more_listeners_than_channel_max_fail_start_naming_the_numbers(
    runtime: Runtime, broker: Broker, queue_factory: Any
) -> None:
    h = broker.handle
    qs = [queue_factory(declare=True) for _ in range(3)]
    h.eval_erlang("application:set_env(rabbit, channel_max, 3).")
    try:
        app = runtime.app(startup_timeout=120)
        for q in qs:
            runtime.listen(app, q, Seen().behaviour(), dict, dead_letter=None)
        t = time.monotonic()
        with pytest.raises(FatalConnectError, match=r"needs 7 channels .*channel_max=3") as err:
            start(runtime, app)
        print(f"FIG channel-max {runtime.kind}: {time.monotonic() - t:.2f} s, {err.value}")
        assert time.monotonic() - t < 30  # promptly, not after startup_timeout (120 s)
    finally:
        h.eval_erlang("application:set_env(rabbit, channel_max, 2047).")
    assert all(broker.counts(q).consumers == 0 for q in qs)


def test_a_purge_mid_run_breaks_nothing(
    runtime: Runtime, broker: Broker, queue_factory: Any, caplog: pytest.LogCaptureFixture
) -> None:
    q = queue_factory(declare=True)
    seen = Seen()
    app = runtime.app()
    runtime.listen(app, q, seen.behaviour(0.05), dict, consumer=Consumer(prefetch=5))
    with runtime.running(app):
        broker.publish(q, bodies(200))
        eventually(lambda: len(seen.ids) >= 10)
        purged = broker.handle.purge(q)
        assert purged > 0
        broker.wait_for(q, ready=0, unacked=0, consumers=1, timeout=20)
        handled = len(seen.ids)
        broker.publish(q, bodies(10, 1000))
        eventually(lambda: len(seen.ids) == handled + 10)
        broker.wait_for(q, ready=0, unacked=0, consumers=1)
        assert app.is_running  # type: ignore[attr-defined]
    # purged (ready) + handled (the in-flight ones were acked, never purged) = published
    dup = len(seen.ids) - len(set(seen.ids))
    print(f"FIG purge {runtime.kind}: purged={purged} handled={handled} of 200, twice={dup}")
    assert purged + handled == 200
    assert len(set(seen.ids)) == len(seen.ids)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
