"""The core's flow control without a broker: circuit breaker, token bucket, per-key gate.

Time is injected (a list the test moves forward); hypothesis generates the
outcomes, the arrival times and the keys.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Hashable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ackkit import AckMode, Batch, Consumer, Flow, Queue, RetryLater
from ackkit._app.spec import probe_for
from ackkit._core.actions import Nack
from ackkit._core.breaker import STEPS, Breaker, BreakerState
from ackkit._core.flow import FlowPolicy
from ackkit._core.gate import Admission, FlowStep
from ackkit._core.gate import Flow as Gate
from ackkit._core.limiter import TokenBucket
from ackkit._core.listener import ListenerCore
from ackkit._core.policy import ListenerPolicy, Retry
from ackkit._core.tracked import Tracked
from ackkit.errors import BadPayload
from ackkit.flow import CircuitBreaker, FlowState, RateLimit, SerialKey
from ackkit.observability import Stage


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


# -- options ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kw", "err"),
    [
        ({"failure_ratio": 0}, ValueError),
        ({"failure_ratio": 1.5}, ValueError),
        ({"failure_ratio": "half"}, TypeError),
        ({"window": 0}, ValueError),
        ({"min_attempts": 0}, ValueError),
        ({"open_for": -1}, ValueError),
        ({"probes": 0}, ValueError),
        ({"trip_on": "ValueError"}, TypeError),
    ],
)
def test_breaker_options_fail_at_once(kw: dict[str, Any], err: type[Exception]) -> None:
    with pytest.raises(err, match="CircuitBreaker"):
        CircuitBreaker(**kw)


def test_rate_and_key_options_fail_at_once() -> None:
    with pytest.raises(ValueError, match=r"RateLimit.per_second"):
        RateLimit(0)
    with pytest.raises(TypeError, match=r"RateLimit.per_second"):
        RateLimit(True)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"RateLimit.burst"):
        RateLimit(10, burst=0)
    with pytest.raises(ValueError, match=r"SerialKey\.property must be one of"):
        SerialKey.property("headers")
    with pytest.raises(ValueError, match=r"SerialKey\.name"):
        SerialKey.header("")
    with pytest.raises(TypeError, match="circuit_breaker must be a CircuitBreaker"):
        FlowPolicy(breaker=0.5)  # type: ignore[arg-type]


@pytest.mark.parametrize("rate", [5e-324, 1e-300, 1e-11, 1 / 86400 / 2])
def test_a_rate_below_one_start_a_day_fails_at_once(rate: float) -> None:
    """5e-324 made the bucket's interval infinite (its tolerance NaN: no limit at all);
    1e-11 made App's worker wait 1e11 s for the second start, past the thread timer's
    maximum: an OverflowError stopped the app at its second delivery."""
    with pytest.raises(ValueError, match=r"RateLimit.per_second must be at least one start a day"):
        RateLimit(rate)


def test_the_slowest_rate_waits_within_the_thread_timer() -> None:
    import threading

    tb = TokenBucket(RateLimit(1 / 86400))
    assert tb.reserve(1, 0.0) == 0.0
    wait = tb.reserve(65535, 0.0)  # the largest batch
    assert 86400 <= wait <= threading.TIMEOUT_MAX


def test_breaker_refused_with_no_ack() -> None:
    with pytest.raises(ValueError, match=r"AckMode\.NONE"):
        ListenerPolicy("l", "q", mode=AckMode.NONE, flow=FlowPolicy(breaker=CircuitBreaker()))


def test_what_counts_as_a_breaker_failure() -> None:
    cb = CircuitBreaker(trip_on=(ConnectionError,))
    assert cb.counts(ConnectionError())
    assert not cb.counts(ValueError())
    assert not cb.counts(None)
    everything = CircuitBreaker()
    assert everything.counts(RetryLater())  # a transient failure, by the handler's word
    assert not everything.counts(BadPayload("x"))  # the message's fault, not the dependency's


def test_serial_key_reads_headers_and_properties() -> None:
    class Props:
        correlation_id = "c-1"
        message_id = None

    h = SerialKey.header("k")
    assert h.of({"k": b"a"}, Props()) == "a" == h.of({"k": "a"}, Props())
    assert h.of({}, Props()) is None
    assert h.of({"k": {"nested": 1}}, Props()) == repr({"nested": 1})
    assert SerialKey.property("correlation_id").of(None, Props()) == "c-1"
    assert SerialKey.property("message_id").of(None, Props()) is None
    assert SerialKey.property("routing_key").of(None, Props(), "rk") == "rk"


# -- the breaker ------------------------------------------------------------------------

outcomes = st.lists(
    st.tuples(st.floats(0, 3.0, allow_nan=False), st.booleans()), min_size=1, max_size=300
)
breakers = st.builds(
    CircuitBreaker,
    failure_ratio=st.sampled_from([0.1, 0.25, 0.5, 0.9, 1.0]),
    window=st.sampled_from([1.0, 5.0, 30.0]),
    min_attempts=st.integers(1, 20),
    open_for=st.sampled_from([0.5, 2.0, 10.0]),
    probes=st.integers(1, 4),
)


@settings(max_examples=300, deadline=None)
@given(cfg=breakers, events=outcomes)
def test_breaker_trips_exactly_when_the_window_says_so(
    cfg: CircuitBreaker, events: list[tuple[float, bool]]
) -> None:
    """Closed, the breaker trips on the first failure after which the calls counted in
    the window (buckets of window/STEPS that started within the window) are at least
    min_attempts and the failures at least failure_ratio of them; a reference model
    kept as a plain list agrees at every step."""
    b = Breaker(cfg)
    width = cfg.window / STEPS
    seen: list[tuple[int, bool]] = []  # since the last reset: (bucket, failed)
    now = 0.0
    for dt, failed in events:
        now += dt
        if b.state is BreakerState.OPEN:
            assert not b.record(failed, now)  # calls that started before the trip
            opened = b.poll(now)
            assert opened == (now >= b.until)
            if not opened:
                continue
        if b.state is BreakerState.HALF_OPEN:
            before = b.probe_ok
            tripped = b.record(failed, now)
            assert tripped == failed
            if not failed and before + 1 >= cfg.probes:
                assert b.state is BreakerState.CLOSED
                seen = []
            continue
        bucket = math.floor(now / width)
        seen.append((bucket, failed))
        live = [f for bk, f in seen if bk > bucket - STEPS]
        should = (
            failed and len(live) >= cfg.min_attempts and sum(live) >= cfg.failure_ratio * len(live)
        )
        assert b.record(failed, now) == should
        if should:
            assert b.state is BreakerState.OPEN
            assert b.until == now + cfg.open_for
            seen = []
        else:
            assert b.window_counts(now) == (len(live), sum(live))


@settings(max_examples=100, deadline=None)
@given(cfg=breakers, gaps=st.lists(st.floats(0, 2.0, allow_nan=False), max_size=200))
def test_successes_never_trip(cfg: CircuitBreaker, gaps: list[float]) -> None:
    b = Breaker(cfg)
    now = 0.0
    for g in gaps:
        now += g
        assert not b.record(False, now)
    assert b.state is BreakerState.CLOSED


def test_breaker_half_open_cycle() -> None:
    cfg = CircuitBreaker(failure_ratio=0.5, window=10, min_attempts=4, open_for=5, probes=2)
    b = Breaker(cfg)
    for i in range(3):
        assert not b.record(True, float(i))  # 3 calls: below min_attempts
    assert b.record(True, 3.0)
    assert not b.poll(7.9)
    assert b.poll(8.0) and b.state is BreakerState.HALF_OPEN
    assert b.record(True, 8.1)  # a failed probe: open again, for open_for
    assert b.until == pytest.approx(13.1)
    assert b.poll(13.1)
    assert not b.record(False, 13.2)
    assert b.state is BreakerState.HALF_OPEN
    assert not b.record(False, 13.3)
    assert b.state is BreakerState.CLOSED
    assert b.trips == 2


# -- the token bucket -------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(
    rate=st.sampled_from([0.5, 1.0, 7.0, 100.0, 1000.0]),
    burst=st.integers(1, 10),
    gaps=st.lists(st.floats(0, 0.5, allow_nan=False), min_size=1, max_size=200),
)
def test_token_bucket_never_exceeds_rate_plus_burst(
    rate: float, burst: int, gaps: list[float]
) -> None:
    """Over any span of s seconds at most burst + rate * s starts are booked; no start
    is booked before its request; a request that finds credit starts at once."""
    tb = TokenBucket(RateLimit(rate, burst))
    now = 0.0
    starts: list[float] = []
    for g in gaps:
        now += g
        wait = tb.reserve(1, now)
        assert wait >= 0
        starts.append(now + wait)
    assert starts == sorted(starts)
    eps = 1e-9
    for i in range(len(starts)):
        for j in range(i, len(starts)):
            span = starts[j] - starts[i]
            assert j - i + 1 <= burst + rate * span + eps


def test_token_bucket_starts_at_once_when_idle_and_batches_count_each() -> None:
    tb = TokenBucket(RateLimit(10, burst=5))
    assert [tb.reserve(1, 0.0) for _ in range(5)] == [0.0] * 5  # the burst
    assert tb.reserve(1, 0.0) == pytest.approx(0.1)
    tb = TokenBucket(RateLimit(10))
    assert tb.reserve(5, 0.0) == pytest.approx(0.4)  # a batch of 5: its last start conforms
    assert tb.reserve(1, 0.4) == pytest.approx(0.1)
    assert tb.reserve(1, 100.0) == 0.0  # idle credit is capped by the burst


# -- the gate: a runtime simulated ---------------------------------------------------------


class Sim:
    """Drives a gate (`_core.gate.Flow`) like a runtime does: a run queue, handlers
    that start and end."""

    def __init__(self, policy: FlowPolicy) -> None:
        self.clock = Clock()
        self.events: list[Stage] = []
        self.flow = Gate(policy, self.clock, lambda s, r: self.events.append(s))
        self.keys: dict[Tracked, Hashable | None] = {}
        self.order: dict[Tracked, int] = {}
        self.queue: list[Tracked] = []  # the runtime's run queue (admitted)
        self.running: list[Tracked] = []
        self.started: list[Tracked] = []
        self.returned: list[Tracked] = []
        self.consumer = True
        self.n = 0

    def apply(self, step: FlowStep) -> None:
        self.returned.extend(step.returned)
        self.queue.extend(step.ready)
        if step.consume is not None:
            self.consumer = step.consume

    def arrive(self, key: Hashable | None) -> None:
        if not self.consumer:
            return  # no consumer: nothing is delivered
        self.n += 1
        t = Tracked(self.n, 1, 1, None, "", "")
        self.keys[t] = key
        self.order[t] = self.n
        a = self.flow.arrive(t, key)
        if a is Admission.RUN:
            self.queue.append(t)
        elif a is Admission.RETURN:
            self.returned.append(t)

    def start(self) -> None:
        if not self.queue:
            return
        t = self.queue.pop(0)
        if not self.flow.may_start(t):
            self.returned.append(t)
            self.apply(self.flow.done([t], None))
            return
        busy = {self.keys[r] for r in self.running} - {None}
        assert self.keys[t] is None or self.keys[t] not in busy, "a key ran twice at once"
        self.running.append(t)
        self.started.append(t)

    def finish(self, i: int, failed: bool) -> None:
        if not self.running:
            return
        t = self.running.pop(i % len(self.running))
        self.apply(self.flow.done([t], failed))

    def check(self) -> None:
        f = self.flow
        everyone = set(self.keys)
        placed = (
            set(self.queue) | set(self.running) | set(self.returned) | set(f.keys) | set(f.parked)
        )
        done = set(self.started) - set(self.running)
        assert everyone == placed | done, "a delivery went missing"
        assert not (set(self.returned) & set(self.started)), "returned and started"
        assert len(self.returned) == len(set(self.returned)), "returned twice"
        if f.state in (FlowState.PAUSED, FlowState.TRIPPED):
            assert f.waiting == 0, "held in the gate while not consuming"
            assert not self.consumer


_arrive = st.tuples(st.just("arrive"), st.sampled_from([None, "a", "b", "c"]))
_start = st.tuples(st.just("start"), st.none())
_finish = st.tuples(st.just("finish"), st.tuples(st.integers(0, 5), st.booleans()))
ops = st.lists(
    st.one_of(
        _arrive,
        _arrive,
        _start,
        _start,
        _finish,
        st.tuples(st.just("time"), st.floats(0, 3, allow_nan=False)),
        st.tuples(st.sampled_from(["pause", "resume"]), st.none()).filter(lambda _: True),
    ),
    max_size=150,
)


@settings(max_examples=400, deadline=None)
@given(
    script=ops,
    breaker=st.one_of(st.none(), breakers),
    serial=st.booleans(),
)
def test_gate_keeps_keys_serial_and_loses_nothing(
    script: list[tuple[str, Any]], breaker: CircuitBreaker | None, serial: bool
) -> None:
    """Whatever arrives, fails, pauses and trips: a key never runs twice at once, a key's
    deliveries start in arrival order, every delivery is in exactly one place, nothing
    waits in the gate while the listener does not consume, and a tripped breaker lets
    no handler start until it probes."""
    sim = Sim(FlowPolicy(breaker=breaker, serial_key=SerialKey.header("k") if serial else None))
    for op, arg in script:
        if op == "arrive":
            sim.arrive(arg if serial else None)
        elif op == "start":
            before = sim.flow.state
            n = len(sim.started)
            sim.start()
            if before in (FlowState.PAUSED, FlowState.TRIPPED):
                assert len(sim.started) == n, "a handler started while not consuming"
        elif op == "finish":
            sim.finish(*arg)
        elif op == "time":
            sim.clock.now += arg
            sim.apply(sim.flow.tick())
        elif op == "pause":
            sim.apply(sim.flow.pause())
        else:
            sim.apply(sim.flow.resume())
        sim.check()
    by_key: dict[Hashable, list[int]] = {}
    for t in sim.started:
        if sim.keys[t] is not None:
            by_key.setdefault(sim.keys[t], []).append(sim.order[t])
    for seq in by_key.values():
        assert seq == sorted(seq), "a key's deliveries started out of order"


def test_probing_lets_only_the_probes_run_then_recovers() -> None:
    sim = Sim(FlowPolicy(breaker=CircuitBreaker(min_attempts=2, open_for=5, probes=2)))
    for _ in range(2):
        sim.arrive(None)
        sim.start()
    sim.finish(0, True)
    sim.finish(0, True)
    assert sim.flow.state is FlowState.TRIPPED and not sim.consumer
    assert sim.events == [Stage.TRIPPED]
    sim.clock.now += 5
    sim.apply(sim.flow.tick())
    assert sim.flow.state is FlowState.PROBING and sim.consumer
    for _ in range(5):
        sim.arrive(None)
    assert len(sim.queue) == 2 and sim.flow.waiting == 3  # two probes, three parked
    sim.start()
    sim.start()
    sim.finish(0, False)
    sim.finish(0, False)
    assert sim.flow.state is FlowState.CONSUMING
    assert len(sim.queue) == 3  # the parked ones run now
    assert sim.events == [Stage.TRIPPED, Stage.PROBING, Stage.RECOVERED]


def test_a_failed_probe_returns_the_parked() -> None:
    sim = Sim(FlowPolicy(breaker=CircuitBreaker(min_attempts=1, open_for=1)))
    sim.arrive(None)
    sim.start()
    sim.finish(0, True)
    sim.clock.now += 1
    sim.apply(sim.flow.tick())
    for _ in range(4):
        sim.arrive(None)
    sim.start()
    sim.finish(0, True)
    assert sim.flow.state is FlowState.TRIPPED
    assert len(sim.returned) == 3 and sim.flow.waiting == 0


# -- the core: returned deliveries are not attempts ---------------------------------------


def test_held_back_delivery_comes_back_without_counting_an_attempt() -> None:
    policy = ListenerPolicy("l", "q", retry=Retry(max_attempts=3))
    core = ListenerCore(policy)
    core.channel_opened()
    t = core.receive(1, False, {}, message_id="m-1")
    assert t.attempt == 1
    assert core.gating.hold_back(t, "paused") == [Nack(1, requeue=True)]
    assert core.counters.counts[Stage.RETURNED] == 1
    back = core.receive(2, True, {}, message_id="m-1")
    assert back.attempt == 1 and back.verdict is None  # not an attempt, no restamp
    again = core.receive(3, True, {}, message_id="m-1")  # a second redelivery: counted
    assert again.attempt == 2
    other = core.receive(4, True, {}, message_id=None)
    assert other.attempt == 2  # without a message_id a redelivery counts


def test_no_ack_listener_runs_what_arrived_while_paused() -> None:
    core = ListenerCore(ListenerPolicy("l", "q", mode=AckMode.NONE))
    core.channel_opened()
    step = core.gating.flow.pause()
    assert step.consume is False
    t = core.receive(1)
    assert core.gating.flow.arrive(t) is Admission.RUN and core.gating.flow.may_start(t)
    assert core.counters.counts[Stage.PAUSED] == 1


# -- seen from outside: metrics, log lines, `ackkit run` ------------------------------------


def _tripped_app() -> tuple[Any, ListenerCore]:
    from ackkit import App

    app = App()

    @app.listener(
        "orders",
        name="o",
        flow=Flow(circuit_breaker=CircuitBreaker(min_attempts=1, open_for=5)),
    )
    def handle(body: bytes) -> None: ...

    spec = app.specs[0]
    core = ListenerCore(spec.policy, observer=app._observer())
    probe_for(app._run_instruments(), spec, core)
    core.channel_opened()
    t = core.receive(1)
    core.gating.flow.arrive(t)
    core.gating.flow.done([t], failed=True)
    core.gating.flow.reserve()
    return app, core


def test_metrics_count_trips_and_show_the_flow_state() -> None:
    prometheus_client = pytest.importorskip("prometheus_client")
    from ackkit.metrics import PrometheusMetrics

    registry = prometheus_client.CollectorRegistry()
    app, _ = _tripped_app()
    PrometheusMetrics(app, registry=registry)
    labels = {"listener": "o", "queue": "orders"}
    assert registry.get_sample_value("ackkit_tripped_total", labels) == 1
    assert registry.get_sample_value("ackkit_paused_total", labels) == 0
    assert registry.get_sample_value("ackkit_flow_state", {**labels, "state": "tripped"}) == 1
    assert registry.get_sample_value("ackkit_flow_state", {**labels, "state": "consuming"}) == 0
    assert app.flow_state() == {"o": FlowState.TRIPPED}


def test_trips_and_pauses_are_logged_and_printed_by_ackkit_run(
    caplog: pytest.LogCaptureFixture,
) -> None:
    import io

    from rich.console import Console

    from ackkit.cli import _flow_printer

    out = io.StringIO()
    printer = _flow_printer(Console(file=out, width=200))
    with caplog.at_level(logging.INFO, logger="ackkit"):
        app, core = _tripped_app()
        log_lines = app._observer()
        core._report.observer = lambda e: (log_lines(e), printer(e))
        core.gating.flow.pause()
    lines = [r.getMessage() for r in caplog.records]
    assert any("o: circuit breaker tripped" in ln and "failure ratio" in ln for ln in lines)
    assert any(ln.startswith("o: paused") for ln in lines)
    assert "ackkit: o: paused" in out.getvalue()
    assert not printer.hot  # healthy messages never reach it


def test_listener_options_are_checked_at_once_and_mapped() -> None:
    from ackkit import App

    app = App()

    def handle(body: bytes) -> None: ...

    with pytest.raises(ValueError, match=r"Flow\(serial_key=...\) with batch="):
        app.listener("q", flow=Flow(serial_key=SerialKey.header("k")), batch=Batch(5))
    with pytest.raises(TypeError, match="rate_limit must be"):
        app.listener("q", flow=Flow(rate_limit="fast"))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="circuit_breaker must be"):
        app.listener("q", flow=Flow(circuit_breaker=0.5))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"Consumer\.priority"):
        app.listener("q", consumer=Consumer(priority=2**31))
    with pytest.raises(ValueError, match=r"Consumer\.timeout"):
        app.listener("q", consumer=Consumer(timeout=0))
    with pytest.raises(ValueError, match=r"use Consumer\(priority=...\)"):
        app.listener("q", consumer=Consumer(arguments={"x-priority": 1}))
    with pytest.raises(TypeError, match="exclusive"):
        app.listener("q", consumer=Consumer(exclusive="yes"))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="x-single-active-consumer"):
        app.listener(Queue("q", arguments={"x-single-active-consumer": "yes"}))
    app.listener(
        Queue("q", arguments={"x-single-active-consumer": True}),
        flow=Flow(rate_limit=12.5),
        consumer=Consumer(priority=-3, timeout=90, exclusive=True, arguments={"x-custom": "v"}),
    )(handle)
    spec = app.specs[0]
    assert spec.policy.flow is not None and spec.policy.flow.rate_limit == RateLimit(12.5)
    assert spec.consumer_arguments == {
        "x-custom": "v",
        "x-priority": -3,
        "x-consumer-timeout": 90_000,
    }
    assert spec.exclusive and spec.single_active


def test_rate_budget_survives_a_reconnect() -> None:
    """The bucket belongs to the listener's core, which outlives its channels."""
    clock = Clock()
    core = ListenerCore(
        ListenerPolicy("l", "q", flow=FlowPolicy(rate_limit=RateLimit(2))), clock=clock
    )
    core.channel_opened()
    assert core.gating.flow.reserve() == 0.0
    core.channel_closed()
    core.channel_opened()
    assert core.gating.flow.reserve() == pytest.approx(0.5)  # a new channel gets no new credit
