"""Pull mode: `ack(multiple=True)` / `nack(multiple=True)` settle only the caller's queue.

All of a pull connection's gets share one channel, and the broker applies a
multiple frame to every outstanding delivery of that channel up to its tag,
whichever queue it came from. Getting from two queues in turn and acking one
queue's newest delivery with multiple=True must leave the other queue's
delivery unsettled: the caller may still reject or requeue it. Both runtimes;
what is asserted is what the broker shows (ready / unacked per queue, the
dead-letter queues), before close (which would requeue what is left) and after.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ackkit
from ackkit import Delivery
from tests.contract.conftest import Broker, Runtime

pytestmark = [pytest.mark.integration]


def declare(url: str, *queues: str) -> None:
    with ackkit.connect(url) as c:
        for q in queues:
            c.declare_queue(q)


def counts_are(
    broker: Broker, want: dict[str, tuple[int, int] | None], timeout: float = 15.0
) -> None:
    """Wait until every queue in `want` shows (ready, unacked), or is absent (None); one
    broker query per poll."""
    deadline = time.monotonic() + timeout
    while True:
        table = broker.handle.counts_all()
        seen = {q: (table[q].ready, table[q].unacked) if q in table else None for q in want}
        if seen == want:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"queues show {seen}, expected {want}")
        time.sleep(0.1)


def settle(runtime: Runtime, pull: Any, d: Delivery, kind: str, **kw: bool) -> None:
    """`d.ack(...)` / `d.nack(...)` / `d.reject(...)` on either runtime."""
    done = getattr(d, kind)(**kw)
    if runtime.is_async:
        pull.lt.run(done)


def test_ack_multiple_leaves_the_other_queues_delivery(
    runtime: Runtime, broker: Broker, queue_factory: Any
) -> None:
    qa, qb = queue_factory("a"), queue_factory("b")
    declare(broker.handle.url, qa, qb)
    broker.publish(qa, ['"a1"', '"a2"'])
    broker.publish(qb, ['"b1"'])
    with runtime.pull() as pull:
        a1 = pull.get(qa)  # tag 1
        b1 = pull.get(qb)  # tag 2
        a2 = pull.get(qa)  # tag 3
        assert [a1.body, b1.body, a2.body] == [b'"a1"', b'"b1"', b'"a2"']
        settle(runtime, pull, a2, "ack", multiple=True)
        assert a1.settled and a2.settled and not b1.settled
        counts_are(broker, {qa: (0, 0), qb: (0, 1)})  # b1 still the caller's
        settle(runtime, pull, b1, "reject", requeue=True)
        counts_are(broker, {qb: (1, 0)})  # back in its queue
        again = pull.get(qb)
        assert again is not None and again.body == b'"b1"' and again.redelivered
        settle(runtime, pull, again, "reject", requeue=True)
    # no dead letter: get() declared no dead-letter queue
    counts_are(broker, {qa: (0, 0), qb: (1, 0), f"{qa}.dlq": None, f"{qb}.dlq": None})


def test_nack_multiple_leaves_the_other_queues_delivery(
    runtime: Runtime, broker: Broker, queue_factory: Any
) -> None:
    qa, qb = queue_factory("a"), queue_factory("b")
    declare(broker.handle.url, qa, qb)
    broker.publish(qa, ['"a1"', '"a2"'])
    broker.publish(qb, ['"b1"'])
    with runtime.pull() as pull:
        b1 = pull.get(qb)  # tag 1
        a1 = pull.get(qa)  # tag 2
        a2 = pull.get(qa)  # tag 3
        settle(runtime, pull, a2, "nack", requeue=True, multiple=True)
        assert a1.settled and not b1.settled
        counts_are(broker, {qa: (2, 0), qb: (0, 1)})
        settle(runtime, pull, b1, "ack")
        counts_are(broker, {qb: (0, 0)})
    counts_are(broker, {qa: (2, 0), qb: (0, 0)})


PER_QUEUE = 3
SETTLES = st.sampled_from(
    [
        ("ack", {}),
        ("ack", {"multiple": True}),
        ("nack", {"requeue": True}),
        ("nack", {"requeue": True, "multiple": True}),
        ("nack", {"requeue": False, "multiple": True}),
        ("reject", {"requeue": True}),
        ("reject", {"requeue": False}),
    ]
)


@settings(
    max_examples=10,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    n_queues=st.integers(2, 3),
    gets=st.lists(st.integers(0, 2), min_size=2, max_size=3 * PER_QUEUE),
    plan=st.data(),
)
def test_interleaved_gets_and_settles_lose_nothing(
    runtime: Runtime,
    broker: Broker,
    queue_factory: Any,
    n_queues: int,
    gets: list[int],
    plan: st.DataObject,
) -> None:
    queues = [queue_factory(f"q{i}") for i in range(n_queues)]
    declare(broker.handle.url, *queues)
    for q in queues:
        broker.publish(q, [f'"{i}"' for i in range(PER_QUEUE)])
    ready = dict.fromkeys(queues, PER_QUEUE)
    dead = dict.fromkeys(queues, 0)
    with runtime.pull() as pull:
        held: list[tuple[str, Delivery]] = []  # oldest first
        for i in gets:
            q = queues[i % n_queues]
            d = pull.get(q)
            if d is not None:
                held.append((q, d))
                ready[q] -= 1
        order = plan.draw(st.permutations(range(len(held))), label="settle order")
        mine: set[int] = set()  # indexes into held the caller has settled
        for i in order:
            if i in mine:
                continue  # covered by an earlier multiple settle of its queue
            q, d = held[i]
            kind, kw = plan.draw(SETTLES, label=f"settle of delivery {i}")
            # multiple: this and every earlier delivery of the same queue not yet settled
            now = [j for j in range(i + 1) if held[j][0] == q and j not in mine]
            now = now if kw.get("multiple") else [i]
            settle(runtime, pull, d, kind, **kw)
            mine.update(now)
            assert [x.settled for _, x in held] == [j in mine for j in range(len(held))]
            if kind != "ack":
                if kw.get("requeue"):
                    ready[q] += len(now)
                else:
                    dead[q] += len(now)
        want = {q: (ready[q], 0) for q in queues}
        for q in {q for q, _ in held}:  # declared with its first dead letter, if any
            want[f"{q}.dlq"] = (dead[q], 0) if dead[q] else None
        counts_are(broker, want)  # before close: close would requeue whatever is left
    counts_are(broker, want)
