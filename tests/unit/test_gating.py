"""The flow gate's answers through the core's own protocol (no broker): `receive`,
`admit`, `begin`, `withdraw`, `set_paused`, `tick` and `handled` say run / hold /
return, the rate limit's wait and consume on/off as actions a runtime carries out
without reading the gate's state.

A table of single answers, then hypothesis: a runtime that only does what the
answers say (`Sim`) never runs a delivery it returned, never returns one twice,
sends every return after a `Consume` of the same answer, and ends with every
delivery ran, returned or held, and nothing held once the gate is drained.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ackkit import AckMode
from ackkit._core.actions import Action, Consume, Nack, Run
from ackkit._core.flow import CircuitBreaker, FlowPolicy, FlowState, RateLimit, SerialKey
from ackkit._core.listener import ListenerCore
from ackkit._core.policy import ListenerPolicy
from ackkit._core.tracked import Tracked
from tests.unit._fakes import V3


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def gated_core(flow: FlowPolicy, clock: Clock | None = None, **kw: Any) -> ListenerCore:
    c = ListenerCore(
        ListenerPolicy(name="l", queue="q", flow=flow, **kw),
        clock=clock or Clock(),
        broker=V3,
        gated=True,
    )
    c.channel_opened()
    return c


SERIAL = FlowPolicy(serial_key=SerialKey.header("k"))
BREAKER = FlowPolicy(breaker=CircuitBreaker(min_attempts=1, failure_ratio=1.0, open_for=5))


# -- one answer at a time -------------------------------------------------------------


@pytest.mark.parametrize(
    ("flow", "paused", "keys", "verdicts"),
    [
        (FlowPolicy(), False, [None, None], [None, None]),  # no gate: both run
        (FlowPolicy(), True, [None], [[Consume(False), Nack(1)]]),  # paused: back
        (SERIAL, False, ["a", "a", "b"], [None, [], None]),  # a busy key holds the 2nd
        (SERIAL, False, [None, None], [None, None]),  # no key: nothing holds it
        (SERIAL, True, ["a"], [[Consume(False), Nack(1)]]),
    ],
)
def test_receive_says_run_hold_or_return(
    flow: FlowPolicy, paused: bool, keys: list[str | None], verdicts: list[Any]
) -> None:
    c = gated_core(flow)
    if paused:
        assert c.gating.set_paused(True) == [Consume(False)]
    got = [c.receive(i + 1, headers={"k": k} if k else None).verdict for i, k in enumerate(keys)]
    assert got == verdicts


def test_a_key_from_a_property_is_read_from_the_properties_given() -> None:
    class Props:
        correlation_id = "x"

    c = gated_core(FlowPolicy(serial_key=SerialKey.property("correlation_id")))
    assert c.receive(1, properties=Props()).verdict is None
    assert c.receive(2, properties=Props()).verdict == []  # same key: held


def test_without_the_gate_a_core_never_holds_or_returns() -> None:
    """Pull and Spark cores (not `gated`): a refusal's pause is not theirs to carry out."""
    c = ListenerCore(ListenerPolicy(name="l", queue="q", flow=SERIAL), broker=V3)
    c.channel_opened()
    c.gating.flow.copy_refused("dlq", "full")
    ts = [c.receive(i, headers={"k": "a"}) for i in (1, 2)]
    assert [t.verdict for t in ts] == [None, None]
    assert c.begin(ts).run == tuple(ts)
    assert c.tick() == []


def test_begin_waits_for_the_rate_limit_once() -> None:
    clock = Clock()
    c = gated_core(FlowPolicy(rate_limit=RateLimit(2.0)), clock)
    t1, t2 = c.receive(1), c.receive(2)
    assert c.begin([t1]).delay == 0  # the burst's token
    go = c.begin([t2])
    assert go.run == (t2,) and go.delay == pytest.approx(0.5) and go.actions == []
    clock.now += go.delay
    again = c.begin(go.run, waited=True)  # not booked a second time
    assert again.run == (t2,) and again.delay == 0


def test_begin_returns_what_may_no_longer_start() -> None:
    c = gated_core(FlowPolicy())
    t = c.receive(1)
    assert t.verdict is None
    c.gating.set_paused(True)  # between the inbox and the worker
    go = c.begin([t])
    assert go.run == () and go.actions == [Consume(False), Nack(1)]
    assert c.begin([c.receive(2)]).run == ()  # returned at once by receive


def test_a_stopping_core_releases_instead_of_waiting() -> None:
    c = gated_core(FlowPolicy(rate_limit=RateLimit(1.0)))
    ts = [c.receive(1), c.receive(2)]
    c.shutdown.stop()
    go = c.begin(ts)
    assert go.run == () and go.delay == 0 and len(go.actions) == 2


def test_resume_consumes_again_and_pause_twice_is_nothing() -> None:
    c = gated_core(FlowPolicy())
    assert c.gating.set_paused(True) == [Consume(False)]
    assert c.gating.set_paused(True) == []
    assert not c.gating.consuming
    assert c.gating.set_paused(False) == [Consume(True)]
    assert c.gating.set_paused(False) == []
    assert c.gating.consuming


def test_pausing_returns_what_the_gate_holds() -> None:
    c = gated_core(SERIAL)
    t1 = c.receive(1, headers={"k": "a"})
    t2 = c.receive(2, headers={"k": "a"})
    assert (t1.verdict, t2.verdict) == (None, [])
    assert c.gating.set_paused(True) == [Consume(False), Nack(2)]
    # the running one finishes; nothing is let through while paused
    assert not any(type(a) is Run for a in c.handled((t1,), None, None).actions)


def test_a_database_down_pause_returns_the_call_that_gave_up_first() -> None:
    """The inbox's database is down: the deliveries of the call go back with the pause,
    before what the gate held, and their keys are freed."""
    c = gated_core(SERIAL)
    t1 = c.receive(1, headers={"k": "a"})
    assert c.receive(2, headers={"k": "a"}).verdict == []  # held behind 1
    assert c.gating.set_paused(True, "db down", returning=[t1]) == [
        Consume(False),
        Nack(1),
        Nack(2),
    ]
    assert c.gating.flow.waiting == 0 and not c.gating.flow.holding
    assert c.gating.set_paused(False) == [Consume(True)]
    assert c.receive(3, headers={"k": "a"}).verdict is None  # the key is free again


def test_withdraw_keeps_what_may_still_start() -> None:
    c = gated_core(BREAKER)
    ts = [c.receive(i) for i in (1, 2, 3)]
    assert c.gating.withdraw(ts) == (ts, [])  # consuming: all may start
    c.gating.set_paused(True)
    keep, acts = c.gating.withdraw(ts)
    assert keep == [] and acts == [Nack(1), Nack(2), Nack(3)]  # no Consume: it is one


def test_the_breaker_trips_and_probes_through_tick() -> None:
    clock = Clock()
    c = gated_core(BREAKER, clock)
    t = c.receive(1)
    out = c.handled((t,), None, ValueError("down"))
    assert Consume(False) in out.actions and c.gating.flow.state is FlowState.TRIPPED
    assert c.tick() == []
    clock.now += 5
    assert Consume(True) in c.tick()
    assert c.gating.flow.state is FlowState.PROBING


def test_a_delivery_of_a_closed_channel_is_never_let_through() -> None:
    """Its key goes to the next one instead (a Run of an old tag would be another
    delivery's tag on the new channel)."""
    c = gated_core(SERIAL)
    t1 = c.receive(1, headers={"k": "a"})
    t2 = c.receive(2, headers={"k": "a"})
    assert c.begin([t1]).run == (t1,)  # its handler runs through the close
    c.channel_closed()
    c.channel_opened()
    t3 = c.receive(1, headers={"k": "a"})  # tag 1 again, on the new channel
    assert (t1.verdict, t2.verdict, t3.verdict) == (None, [], [])
    acts = c.handled((t1,), None, None).actions
    assert acts == [Run(1)] and t3.generation == c.generation  # t3, not t2


def test_no_ack_mode_runs_what_arrives_while_paused() -> None:
    c = gated_core(FlowPolicy(), mode=AckMode.NONE)
    c.gating.set_paused(True)
    assert c.receive(1).verdict is None  # the broker forgot it on send


# -- a runtime that only does what the answers say ---------------------------------------


class Sim:
    """Carries out the answers: Consume switches `consumer`, Nack returns, Run queues."""

    def __init__(self, c: ListenerCore) -> None:
        self.c = c
        self.consumer = True
        self.queued: list[Tracked] = []  # waiting for a worker
        self.running: list[Tracked] = []
        self.ran: set[int] = set()
        self.returned: set[int] = set()
        self.by_tag: dict[int, Tracked] = {}

    def carry_out(self, acts: list[Action]) -> None:
        switched = False
        for a in acts:
            if type(a) is Consume:
                self.consumer = a.on
                switched = True
                if not a.on:
                    keep, more = self.c.gating.withdraw(self.queued)
                    self.queued = keep
                    self.carry_out(more)
            elif type(a) is Nack:
                assert a.requeue
                assert switched or not self.consumer, "a return before the consumer went"
                assert a.tag not in self.returned and a.tag not in self.ran
                self.returned.add(a.tag)
                self.queued = [t for t in self.queued if t.tag != a.tag]
            elif type(a) is Run:
                t = self.by_tag[a.tag]
                assert a.tag not in self.returned
                self.queued.append(t)

    def arrive(self, tag: int, key: str | None) -> None:
        t = self.c.receive(tag, headers={"k": key} if key else None)
        self.by_tag[tag] = t
        if t.verdict is None:
            self.queued.append(t)
        else:
            self.carry_out(t.verdict)

    def start(self) -> None:
        if not self.queued:
            return
        t = self.queued.pop(0)
        go = self.c.begin([t], waited=True)
        self.carry_out(go.actions)
        for r in go.run:
            assert r.tag not in self.returned and r.tag not in self.ran
            self.ran.add(r.tag)
            self.running.append(r)

    def finish(self, failed: bool) -> None:
        if not self.running:
            return
        t = self.running.pop(0)
        out = self.c.handled((t,), None, ValueError("x") if failed else None)
        self.carry_out(out.actions)


OPS = st.lists(
    st.one_of(
        st.tuples(st.just("arrive"), st.sampled_from([None, "a", "b"])),
        st.tuples(st.sampled_from(["start", "pause", "resume", "tick"]), st.none()),
        st.tuples(st.just("finish"), st.booleans()),
    ),
    max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(ops=OPS, breaker=st.booleans())
def test_a_runtime_doing_what_the_answers_say_loses_nothing(
    ops: list[tuple[str, Any]], breaker: bool
) -> None:
    clock = Clock()
    flow = FlowPolicy(
        serial_key=SerialKey.header("k"),
        breaker=CircuitBreaker(min_attempts=2, failure_ratio=0.5, open_for=1) if breaker else None,
    )
    c = gated_core(flow, clock)
    sim = Sim(c)
    tag = 0
    for op, arg in ops:
        if op == "arrive":
            tag += 1
            sim.arrive(tag, arg)
        elif op == "start":
            sim.start()
        elif op == "finish":
            sim.finish(arg)
        elif op == "pause":
            sim.carry_out(c.gating.set_paused(True))
        elif op == "resume":
            sim.carry_out(c.gating.set_paused(False))
        else:
            clock.now += 0.6
            sim.carry_out(c.tick())
        assert sim.consumer == c.gating.consuming  # the answers kept the consumer in step
    while sim.running or sim.queued:  # the workers finish what they have
        sim.start()
        sim.finish(False)
    held = {t.tag for t in c.shutdown.take_held()}
    everything = set(range(1, tag + 1))
    assert sim.ran | sim.returned | held == everything
    assert not (sim.ran & sim.returned) and not (held & (sim.ran | sim.returned))
