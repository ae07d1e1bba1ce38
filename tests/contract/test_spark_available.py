"""Contract: Trigger.AvailableNow and admission control of the Spark queue source, without Spark.

`RunnerConsumer` (spark/_available.py) is the consumer of the source's runner. These
tests drive it as the runner does under Trigger.AvailableNow: Spark calls
`prepareForTriggerAvailableNow()` (`prepare_available_now`), then `read(start)`
(`take(start, seal)`) until a read hands out nothing, and the sink says `written(end)`
after each batch. What is asserted is what the broker shows (ready / unacked counts,
consumers) and which messages the batches held.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from .conftest import Broker, eventually

pytest.importorskip("pyspark")  # ackkit.spark needs it at import time (no session is started)

from ackkit.spark import SourceOptions
from ackkit.spark._available import RunnerConsumer
from ackkit.spark._core.batches import BatchPlan
from ackkit.spark._rows import Item

pytestmark = pytest.mark.contract


@contextmanager
def runner(
    url: str,
    queue: str,
    checkpoint: Path,
    *,
    written_upto: int = 0,
    restored: Sequence[tuple[int, list[str | None]]] = (),
    **options: str,
) -> Iterator[RunnerConsumer]:
    """A started runner consumer, as `_Runner.__init__` builds it (restore before start)."""
    opts = SourceOptions.parse(
        {"url": url, "queue": queue, "checkpoint": str(checkpoint), "linger_ms": "20", **options}
    )
    c = RunnerConsumer(opts, None, written_upto=written_upto)
    for end, keys in restored:
        c.restore(end, keys)
    c.start()
    try:
        yield c
    finally:
        c.stop()


def bodies(n: int, first: int = 0, pad: int = 0) -> list[str | bytes]:
    return [json.dumps({"id": i, "pad": "x" * ((i * 37) % (pad + 1))}) for i in range(first, n)]


def ids(items: list[Item]) -> list[int]:
    return [json.loads(it.meta.body)["id"] for it in items]


class Run:
    """Spark's reads of one AvailableNow run: batches until a read hands out nothing."""

    def __init__(self, c: RunnerConsumer, start: int = 0) -> None:
        self.c, self.offset = c, start
        self.batches: list[list[Item]] = []

    def read(self) -> tuple[list[Item], BatchPlan]:
        sealed: list[Item] = []
        plan = self.c.take(self.offset, lambda items, _plan: sealed.extend(items))
        assert plan.start == self.offset and plan.end == self.offset + len(sealed)
        self.offset = plan.end
        if sealed:
            self.batches.append(sealed)
        return sealed, plan

    def to_the_end(self, write: bool = True) -> list[Item]:
        """Read (and write: ack) batches until the run reports no more data."""
        while True:
            rows, plan = self.read()
            if not rows:
                return [it for b in self.batches for it in b]
            if write:
                self.c.written(plan.end)


@pytest.mark.parametrize(
    "n,cap,max_bytes", [(23, 5, None), (40, 50, 700), (1, 1, None)], ids=["count", "bytes", "one"]
)
def test_a_run_reads_what_the_queue_held_at_the_start_in_capped_batches_then_ends(
    broker: Broker, queue_factory: Any, tmp_path: Path, n: int, cap: int, max_bytes: int | None
) -> None:
    q = queue_factory(declare=True)
    broker.publish(q, bodies(n, pad=60))
    later = 7
    caps = {"maxMessagesPerTrigger": str(cap)}
    if max_bytes is not None:
        caps["maxBytesPerTrigger"] = str(max_bytes)
    with runner(broker.handle.url, q, tmp_path, **caps) as c:
        # Connected, but not consuming until Spark asks: nothing is delivered yet.
        broker.wait_for(q, ready=n, unacked=0)
        assert broker.counts(q).consumers == 0
        run = c.prepare_available_now()
        assert run.depth == n
        broker.publish(q, bodies(n + later, first=n))  # during the run: for the next one
        r = Run(c)
        rows = r.to_the_end()
        assert ids(rows) == list(range(n))  # exactly what was there, in order, once
        for batch in r.batches:
            assert len(batch) <= cap
            if max_bytes is not None:
                assert sum(len(it.meta.body) for it in batch) <= max_bytes
        if max_bytes is not None:
            assert len(r.batches) > 1  # the byte cap, not the count, cut them
        assert c.run is not None and c.run.ended is None
        # Nothing of the next run was acked: the later messages wait (some may be prefetched).
        eventually(
            lambda: broker.counts(q).ready + broker.counts(q).unacked == later,
            what="the later messages left alone",
        )
    broker.wait_for(q, ready=later, unacked=0)


def test_batches_respect_both_caps(broker: Broker, queue_factory: Any, tmp_path: Path) -> None:
    q = queue_factory(declare=True)
    sent = bodies(30, pad=200)
    sent.insert(10, json.dumps({"id": 999, "pad": "y" * 2000}))  # larger than the byte cap
    broker.publish(q, sent)
    with runner(
        broker.handle.url, q, tmp_path, maxMessagesPerTrigger="8", maxBytesPerTrigger="900"
    ) as c:
        c.prepare_available_now()
        r = Run(c)
        rows = r.to_the_end()
    assert sorted(ids(rows)) == sorted([*range(30), 999])
    for batch in r.batches:
        size = sum(len(it.meta.body) for it in batch)
        assert len(batch) <= 8
        assert size <= 900 or len(batch) == 1, [len(it.meta.body) for it in batch]
    assert [999] in [ids(b) for b in r.batches]  # the large one went alone
    broker.wait_for(q, ready=0, unacked=0)


def test_a_run_cut_short_and_a_rerun_hand_out_every_message_once(
    broker: Broker, queue_factory: Any, tmp_path: Path
) -> None:
    """Run 1 writes its first batch, hands out (logs) a second and dies before writing it.
    Run 2 restores the log (as the runner does from its write-ahead log), counts what is in
    the queue then (the second batch's messages came back), holds their copies until Spark
    replays that batch, and reads the rest."""
    n, cap = 20, 6
    q = queue_factory(declare=True)
    broker.publish(q, bodies(n))
    with runner(broker.handle.url, q, tmp_path, maxMessagesPerTrigger=str(cap)) as c:
        c.prepare_available_now()
        r1 = Run(c)
        first, p1 = r1.read()
        c.written(p1.end)
        second, p2 = r1.read()  # handed out, never written: the process dies here
    broker.wait_for(q, ready=n - cap, unacked=0)
    logged = [(p1.end, [it.key for it in first]), (p2.end, [it.key for it in second])]
    with runner(
        broker.handle.url,
        q,
        tmp_path,
        written_upto=p1.end,
        restored=logged,
        maxMessagesPerTrigger=str(cap),
    ) as c:
        assert c.prepare_available_now().depth == n - cap
        c.written(p2.end)  # Spark replays batch 2 from the log; the sink writes it
        r2 = Run(c, start=p2.end)
        rest = r2.to_the_end()
        assert c.stats()["copies"] == cap  # batch 2's messages, recognised, not handed out
    assert sorted(ids(first + second + rest)) == list(range(n))
    broker.wait_for(q, ready=0, unacked=0)


def test_a_connection_lost_mid_run_ends_it_and_the_next_run_reads_the_rest(
    broker: Broker, queue_factory: Any, tmp_path: Path
) -> None:
    n, cap = 12, 4
    q = queue_factory(declare=True)
    broker.publish(q, bodies(n))
    with runner(broker.handle.url, q, tmp_path, maxMessagesPerTrigger=str(cap)) as c:
        c.prepare_available_now()
        r1 = Run(c)
        first, p1 = r1.read()
        assert broker.close_connections_named(f"ackkit-spark:{q}") >= 1
        eventually(lambda: c.stats()["connections"] >= 2, what="the reconnect")
        c.written(p1.end)  # on a closed channel: not acked, the broker requeued them
        assert r1.to_the_end() == first  # the run is over: nothing more is handed out
        assert c.run is not None and c.run.ended is not None
        assert broker.counts(q).consumers == 0  # and the new channel does not consume
    broker.wait_for(q, ready=n, unacked=0)
    logged = [(p1.end, [it.key for it in first])]
    with runner(
        broker.handle.url,
        q,
        tmp_path,
        written_upto=p1.end,
        restored=logged,
        maxMessagesPerTrigger=str(cap),
    ) as c:
        assert c.prepare_available_now().depth == n
        rest = Run(c, start=p1.end).to_the_end()
    assert sorted(ids(first + rest)) == list(range(n))
    broker.wait_for(q, ready=0, unacked=0)


def test_a_streaming_runner_consumes_on_the_first_read_within_the_caps(
    broker: Broker, queue_factory: Any, tmp_path: Path
) -> None:
    n = 30
    q = queue_factory(declare=True)
    broker.publish(q, bodies(n, pad=80))
    with runner(broker.handle.url, q, tmp_path, maxBytesPerTrigger="400") as c:
        assert broker.counts(q).consumers == 0  # connected, not consuming: Spark has not asked
        r = Run(c)
        got: list[Item] = []
        eventually(lambda: bool(got.extend(r.read()[0]) or len(got) == n), what="every row")
        assert broker.counts(q).consumers == 1
        assert ids(got) == list(range(n))
        assert len(r.batches) > 1
        for batch in r.batches:
            assert sum(len(it.meta.body) for it in batch) <= 400 or len(batch) == 1
        c.written(r.offset)
    broker.wait_for(q, ready=0, unacked=0)
