"""Flow control on both runtimes against a real broker: pause and resume, the circuit
breaker, the rate limit, concurrency, consumer arguments and the per-key serial mode.

What is asserted comes from the broker where it can: the queue's consumer count
while paused or tripped, ready / unacked counts, what the dead-letter queue holds.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from typing import Any

import pytest

from ackkit import Consumer, Delivery, Flow, Queue, Retry, RetryStrategy
from ackkit.flow import CircuitBreaker, FlowState, RateLimit, SerialKey
from ackkit.observability import Stage

from .conftest import IO, Broker, Runtime, eventually

pytestmark = pytest.mark.contract


def bodies(n: int, start: int = 0) -> list[str | bytes]:
    return [json.dumps({"id": i}) for i in range(start, start + n)]


class Seen:
    """Thread-safe record of handler calls: (id, attempt, started, ended)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls: list[tuple[int, int]] = []
        self.running = 0
        self.most = 0
        self.starts: list[float] = []

    def enter(self, d: Delivery) -> None:
        with self.lock:
            self.calls.append((json.loads(d.body)["id"], d.attempt))
            self.starts.append(time.monotonic())
            self.running += 1
            self.most = max(self.most, self.running)

    def leave(self) -> None:
        with self.lock:
            self.running -= 1

    def ids(self) -> list[int]:
        with self.lock:
            return [i for i, _ in self.calls]

    def __len__(self) -> int:
        with self.lock:
            return len(self.calls)


# -- pause and resume -------------------------------------------------------------------


def test_pause_cancels_the_consumer_and_returns_held_deliveries(
    runtime: Runtime, broker: Broker, queue_factory: Any
) -> None:
    """Paused: the broker shows no consumer and nothing unacked; the prefetched deliveries
    are back on the queue; resumed, every message is handled, none as a second attempt."""
    q = queue_factory(declare=True)
    seen = Seen()
    gate = threading.Event()

    async def handle(d: Delivery, _: Delivery, io: IO) -> None:
        seen.enter(d)
        try:
            while not gate.is_set():
                await io.sleep(0.01)
        finally:
            seen.leave()

    app = runtime.app()
    runtime.listen(app, q, handle, consumer=Consumer(prefetch=20), retry=Retry(max_attempts=3))
    broker.publish(q, bodies(40))
    with runtime.running(app):
        broker.wait_for(q, unacked=20, consumers=1)
        eventually(lambda: len(seen) == 1, what="the first handler running")
        app.pause()  # type: ignore[attr-defined]
        eventually(lambda: set(app.flow_state().values()) == {FlowState.PAUSED})
        # the 19 held ones are back at once; the one in its handler still runs (over AMQP
        # 1.0 its link stays attached, without credit, until it is settled: a detach
        # would return it)
        broker.wait_for(q, consumers=int(runtime.kind == "amqp10"), unacked=1, ready=39)
        gate.set()
        broker.wait_for(q, consumers=0, unacked=0, ready=39)
        time.sleep(0.3)
        assert len(seen) == 1, "a handler started while paused"
        app.resume()  # type: ignore[attr-defined]
        broker.wait_for(q, ready=0, unacked=0, consumers=1, timeout=30)
        eventually(lambda: len(seen) == 40, what="all 40 handled")
        s = runtime.stats(app)
    assert sorted(seen.ids()) == list(range(40))
    assert all(a == 1 for _, a in seen.calls), "a returned delivery counted as an attempt"
    assert s["paused"] == 1 and s["resumed"] == 1
    assert s["returned"] >= 19
    assert broker.counts(f"{q}.dlq").total == 0


def test_pause_survives_a_reconnect(runtime: Runtime, broker: Broker, queue_factory: Any) -> None:
    q = queue_factory(declare=True)
    seen = Seen()

    async def handle(d: Delivery, _: Delivery, io: IO) -> None:
        seen.enter(d)
        seen.leave()

    app = runtime.app()
    runtime.listen(app, q, handle)
    with runtime.running(app):
        broker.wait_for(q, consumers=1)
        app.pause()  # type: ignore[attr-defined]
        broker.wait_for(q, consumers=0)
        assert broker.close_connections_named(runtime.connection_name) >= 1
        time.sleep(3.0)  # reconnected meanwhile (reconnect_max_interval 1 s)
        broker.publish(q, bodies(5))
        time.sleep(0.5)
        assert broker.counts(q).consumers == 0 and len(seen) == 0
        app.resume()  # type: ignore[attr-defined]
        broker.wait_for(q, ready=0, unacked=0, consumers=1)
        eventually(lambda: len(seen) == 5)


def test_pause_of_an_unknown_listener_is_refused(runtime: Runtime, queue_factory: Any) -> None:
    q = queue_factory(declare=True)

    async def handle(d: Delivery, _: Delivery, io: IO) -> None:
        pass

    app = runtime.app()
    runtime.listen(app, q, handle, name="mine")
    with pytest.raises(RuntimeError, match="not running"):
        app.pause()  # type: ignore[attr-defined]
    with runtime.running(app), pytest.raises(ValueError, match="no listener named 'other'"):
        app.pause("other")  # type: ignore[attr-defined]


# -- the circuit breaker ---------------------------------------------------------------------


class Dependency:
    """What the handler depends on: down or up, and how often it was called."""

    def __init__(self) -> None:
        self.down = True
        self.calls = 0
        self.calls_when_down = 0
        self.lock = threading.Lock()

    def call(self) -> None:
        with self.lock:
            self.calls += 1
            if self.down:
                self.calls_when_down += 1
                raise ConnectionError("dependency down")


def test_breaker_trips_stops_consuming_probes_and_recovers(
    runtime: Runtime, broker: Broker, queue_factory: Any
) -> None:
    """A failing dependency trips the breaker after min_attempts calls: the broker shows
    no consumer and nothing unacked, the rest waits in the queue (not attempted, not
    dead-lettered); a failed probe trips it again; once the dependency is back, a probe
    succeeds and the queue drains. Only the calls made while it failed dead-lettered."""
    q = queue_factory(declare=True)
    dep = Dependency()
    events: list[Stage] = []

    async def handle(d: Delivery, _: Delivery, io: IO) -> None:
        dep.call()

    def watch(e: Any) -> None:
        if e.stage in (Stage.TRIPPED, Stage.PROBING, Stage.RECOVERED):
            events.append(e.stage)

    app = runtime.app()
    app.on_event(watch)
    breaker = CircuitBreaker(failure_ratio=0.5, window=10, min_attempts=5, open_for=1.5)
    runtime.listen(
        app,
        q,
        handle,
        consumer=Consumer(prefetch=50),
        flow=Flow(circuit_breaker=breaker),
        retry=Retry(3),
    )
    broker.publish(q, bodies(200))
    with runtime.running(app):
        broker.wait_for(q, consumers=0, unacked=0, timeout=30)
        # tripped (or probing already: open_for is short and the broker query is slow)
        assert set(app.flow_state().values()) <= {FlowState.TRIPPED, FlowState.PROBING}
        assert broker.counts(q).ready + dep.calls >= 200  # the rest waits, not attempted
        # tripped: open_for passes, one probe fails, tripped again (and again)
        eventually(lambda: events.count(Stage.TRIPPED) >= 2, timeout=20, what="a failed probe")
        dep.down = False
        eventually(lambda: Stage.RECOVERED in events, timeout=30, what="recovered")
        broker.wait_for(q, ready=0, unacked=0, consumers=1, timeout=60)
        s = runtime.stats(app)
        trips = events.count(Stage.TRIPPED)
    for e1, e2 in itertools.pairwise(events):
        if e1 is Stage.PROBING:
            assert e2 in (Stage.TRIPPED, Stage.RECOVERED)
    assert events[-1] is Stage.RECOVERED
    failed = dep.calls_when_down
    # tripped by the 5th call (min_attempts), then one failed probe per re-trip: no call
    # beyond the probe while half-open
    assert failed == 5 + trips - 1
    # each failed call was an attempt of its message, retried through a delay queue
    assert s["retrying"] == failed
    assert broker.counts(f"{q}.dlq").total == 0
    assert s["tripped"] == trips and s["returned"] >= 45
    assert dep.calls - failed == 200  # every message succeeded once


@pytest.mark.parametrize("strategy", [RetryStrategy.BROKER, RetryStrategy.IN_PROCESS])
def test_tripped_breaker_returns_without_counting_attempts(
    runtime: Runtime, broker: Broker, queue_factory: Any, strategy: RetryStrategy
) -> None:
    """Deliveries returned by a trip come back as the same attempt: with max_attempts=2
    and a dependency down for two trips, no message that never ran reaches the DLQ."""
    q = queue_factory(declare=True)
    dep = Dependency()
    attempts: list[int] = []
    calls: dict[int, int] = {}

    async def handle(d: Delivery, _: Delivery, io: IO) -> None:
        attempts.append(d.attempt)
        n = json.loads(d.body)["id"]
        calls[n] = calls.get(n, 0) + 1
        dep.call()

    app = runtime.app()
    breaker = CircuitBreaker(failure_ratio=1.0, window=10, min_attempts=1, open_for=0.5)
    retry = Retry(max_attempts=2, initial_interval=0.05, strategy=strategy)
    runtime.listen(
        app,
        q,
        handle,
        consumer=Consumer(prefetch=30),
        flow=Flow(circuit_breaker=breaker),
        retry=retry,
    )
    broker.publish(q, bodies(30))
    with runtime.running(app):
        eventually(lambda: app.stats() and runtime.stats(app)["tripped"] >= 3, timeout=30)
        dep.down = False
        broker.wait_for(q, ready=0, unacked=0, consumers=1, timeout=60)
    dead = broker.take_all(f"{q}.dlq")
    # only messages whose handler failed twice are dead letters: none that never ran
    for m in dead:
        assert m.headers["ackkit-attempts"] == 2
        assert json.loads(m.body)["id"] in calls, m.headers["ackkit-reason"]
        assert calls[json.loads(m.body)["id"]] == 2
    assert max(attempts) <= 2
    assert sorted(calls) == list(range(30))


# -- rate and concurrency limits -------------------------------------------------------------


def test_rate_limit_spaces_handler_starts(
    runtime: Runtime, broker: Broker, queue_factory: Any
) -> None:
    q = queue_factory(declare=True)
    seen = Seen()

    async def handle(d: Delivery, _: Delivery, io: IO) -> None:
        seen.enter(d)
        seen.leave()

    app = runtime.app()
    runtime.listen(
        app,
        q,
        handle,
        flow=Flow(rate_limit=RateLimit(20, burst=2)),
        consumer=Consumer(concurrency=4),
    )
    broker.publish(q, bodies(40))
    with runtime.running(app):
        eventually(lambda: len(seen) == 40, timeout=30)
        broker.wait_for(q, ready=0, unacked=0)
        s = runtime.stats(app)
    span = seen.starts[-1] - seen.starts[0]
    # 40 starts at 20/s with a burst of 2: at least (40 - 2) / 20 = 1.9 s
    assert span >= 1.85, span
    assert s["throttled"] >= 30


def test_concurrency_bounds_handlers_in_flight(
    runtime: Runtime, broker: Broker, queue_factory: Any
) -> None:
    q = queue_factory(declare=True)
    seen = Seen()

    async def handle(d: Delivery, _: Delivery, io: IO) -> None:
        seen.enter(d)
        try:
            await io.sleep(0.02)
        finally:
            seen.leave()

    app = runtime.app()
    runtime.listen(app, q, handle, consumer=Consumer(prefetch=100, concurrency=3))
    broker.publish(q, bodies(60))
    with runtime.running(app):
        eventually(lambda: len(seen) == 60, timeout=30)
    assert seen.most <= 3
    assert seen.most >= 2  # it did run handlers side by side


# -- consumer arguments --------------------------------------------------------------------------


def test_consumer_priority_and_exclusive_reach_the_broker(
    runtime: Runtime, broker: Broker, queue_factory: Any
) -> None:
    q = queue_factory(declare=True)

    async def handle(d: Delivery, _: Delivery, io: IO) -> None:
        pass

    app = runtime.app()
    runtime.listen(app, q, handle, consumer=Consumer(priority=7, exclusive=True))
    if runtime.kind == "amqp10":  # no exclusive consumers over AMQP 1.0: said at start
        with pytest.raises(ValueError, match="exclusive consumer is an AMQP 0-9-1 option"):
            app.start()  # type: ignore[attr-defined]
        app = runtime.app()
        runtime.listen(app, q, handle, consumer=Consumer(priority=7))
    with runtime.running(app):
        broker.wait_for(q, consumers=1)
        out = broker.handle.ctl(
            "list_consumers", "-p", broker.handle.vhost, "queue_name", "arguments"
        )
        line = next(ln for ln in out.splitlines() if ln.startswith(q + "\t"))
        assert "x-priority" in line and "7" in line, line
        if runtime.kind == "amqp10":
            return
        # an exclusive consumer: nobody else may consume the queue
        conn = broker.handle.connect()
        try:
            ch = conn.channel()
            with pytest.raises(Exception, match=r"ACCESS_REFUSED|exclusive"):
                ch.basic_consume(q, lambda *a: None)
        finally:
            if conn.is_open:
                conn.close()


def test_single_active_consumer_standby_is_not_an_error(
    runtime: Runtime, broker: Broker, queue_factory: Any
) -> None:
    """Two apps on a single-active-consumer queue: the standby starts, runs, receives
    nothing and is not failed; it takes over when the active one stops."""
    q = queue_factory()
    args = {"x-single-active-consumer": True}
    first, second = Seen(), Seen()

    def listener(seen: Seen) -> Any:
        async def handle(d: Delivery, _: Delivery, io: IO) -> None:
            seen.enter(d)
            seen.leave()

        return handle

    a = runtime.app()
    runtime.listen(a, Queue(q, arguments=args), listener(first))
    b = runtime.app()
    runtime.listen(b, Queue(q, arguments=args), listener(second))
    with runtime.running(a):
        broker.wait_for(q, consumers=1)
        with runtime.running(b):
            broker.wait_for(q, consumers=2)
            broker.publish(q, bodies(10))
            eventually(lambda: len(first) == 10)
            assert len(second) == 0
            assert b.is_running  # type: ignore[attr-defined]
            runtime.stop(a)
            broker.publish(q, bodies(5, 10))
            eventually(lambda: len(second) == 5, what="the standby took over")
            assert b.is_running  # type: ignore[attr-defined]


# -- per-key serial mode ----------------------------------------------------------------------


def test_serial_key_runs_one_per_key_in_order_and_a_failing_key_holds_only_itself(
    runtime: Runtime, broker: Broker, queue_factory: Any
) -> None:
    """Deliveries of one key never overlap and run in publish order; a key whose message
    is retrying in process holds back that key only: the other keys finish first."""
    q = queue_factory(declare=True)
    lock = threading.Lock()
    running: dict[str, int] = {}
    order: dict[str, list[int]] = {}
    overlaps: list[str] = []
    failed_once: set[int] = set()
    started_at: dict[int, float] = {}
    ended_at: dict[str, float] = {}

    async def handle(d: Delivery, _: Delivery, io: IO) -> None:
        key = d.headers["k"]
        n = json.loads(d.body)["id"]
        with lock:
            if running.get(key):
                overlaps.append(key)
            running[key] = running.get(key, 0) + 1
            order.setdefault(key, []).append(n)
            started_at.setdefault(n, time.monotonic())
        try:
            await io.sleep(0.01)
            if key == "slow" and n not in failed_once:
                failed_once.add(n)
                raise ConnectionError("slow key's dependency hiccup")
        finally:
            with lock:
                running[key] -= 1
                ended_at[key] = time.monotonic()

    app = runtime.app()
    retry = Retry(max_attempts=3, initial_interval=0.3, strategy=RetryStrategy.IN_PROCESS)
    runtime.listen(
        app,
        q,
        handle,
        consumer=Consumer(prefetch=100, concurrency=8),
        retry=retry,
        flow=Flow(serial_key=SerialKey.header("k")),
    )
    for i in range(60):
        broker.publish(q, [json.dumps({"id": i})], headers={"k": ["a", "b", "c", "slow"][i % 4]})
    with runtime.running(app):
        eventually(lambda: sum(len(v) for v in order.values()) >= 75, timeout=30)
        broker.wait_for(q, ready=0, unacked=0)
    assert not overlaps
    for key, seq in order.items():
        firsts = list(dict.fromkeys(seq))  # a retried id shows twice in a row
        assert firsts == sorted(firsts), key
    # the slow key retried each of its 15 messages once, in place: 30 calls, in order
    assert order["slow"] == [n for n in range(3, 60, 4) for _ in (0, 1)]
    # ... which held back that key only: the other keys were done long before it
    others_done = max(ended_at[k] for k in ("a", "b", "c"))
    assert others_done < started_at[4 * 4 + 3], "another key waited for the failing one"


def test_serial_keys_are_not_stuck_after_a_reconnect(
    runtime: Runtime, broker: Broker, queue_factory: Any
) -> None:
    """One handler at a time, three keys, the connection cut mid-run: every message is
    handled and the queue drains. Before the fix the listener consumed nothing more: a
    redelivery that waited for the lost-run slot (`max_attempts=1`: one charged run at
    a time) kept its serial key, so the charged copy it waited for waited behind it for
    that key; and on AsyncApp, a handler released at the cut kept its key for ever."""
    q = queue_factory(declare=True)
    seen = Seen()

    async def handle(d: Delivery, _: Delivery, io: IO) -> None:
        seen.enter(d)
        try:
            await io.sleep(0.1)
        finally:
            seen.leave()

    app = runtime.app()
    runtime.listen(
        app,
        q,
        handle,
        consumer=Consumer(prefetch=30, concurrency=1),
        flow=Flow(serial_key=SerialKey.header("k")),
    )
    n = 30
    for i in range(n):
        broker.publish(q, [json.dumps({"id": i})], headers={"k": "abc"[i % 3]})
    with runtime.running(app):
        eventually(lambda: len(seen) >= 3, what="3 handled before the cut")
        assert broker.close_connections_named(runtime.connection_name) >= 1
        last: list[Any] = []

        def drained() -> bool:
            c = broker.counts(q)
            last[:] = [c, sorted(set(seen.ids()))]
            return c.ready == c.unacked == 0 and len(set(seen.ids())) == n

        try:
            eventually(drained, timeout=60, what="every message handled, the queue drained")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; last: {last}") from None
    assert seen.most == 1
    assert broker.counts(f"{q}.dlq").total == 0
