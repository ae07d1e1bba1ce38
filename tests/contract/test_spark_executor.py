"""Contract: the Spark source's consumer settles as the broker expects, without Spark.

`SourceConsumer` (spark/_consumer.py) runs on the same pika Engine, Executor and
confirm Publisher as the App. These tests drive it the way the source's runner
does (spark/_source.py `_Runner`): `offer(start)` is `take(start, seal)` and the
next read starts at `plan.end`; the sink's notice is `written(end)`; a restarted
runner builds the consumer with `written_upto` from its log and `restore`s every
logged batch before `start()`. No SparkSession and no write-ahead log: `seal` only
keeps the rows. What the tests assert is what the broker shows: ready and unacked
counts, the dead-letter queue's bodies and `ackkit-reason` headers.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from ackkit.testing import QueueNotFound

from .conftest import Broker, eventually

pytest.importorskip("pyspark")  # ackkit.spark needs it at import time (no session is started)

from ackkit.spark import SourceOptions
from ackkit.spark._consumer import SourceConsumer, SourceFailed
from ackkit.spark._core.batches import Admission, BatchPlan
from ackkit.spark._rows import Item

pytestmark = pytest.mark.contract

EXAMPLES = settings(
    max_examples=3,  # every example starts a consumer: one connection each
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)


class Order(BaseModel):
    id: int


def orders(ids: list[int]) -> list[str | bytes]:
    return [json.dumps({"id": i}) for i in ids]


@contextmanager
def consumer(
    url: str,
    queue: str,
    checkpoint: Path,
    *,
    written_upto: int = 0,
    restored: Sequence[tuple[int, list[str | None]]] = (),
    **options: str,
) -> Iterator[SourceConsumer]:
    """A started consumer, as `_Runner.__init__` builds it (restore before start)."""
    opts = SourceOptions.parse(
        {"url": url, "queue": queue, "checkpoint": str(checkpoint), **options}
    )
    c = SourceConsumer(opts, Order, written_upto=written_upto)
    for end, keys in restored:
        c.restore(end, keys)
    c.start()
    try:
        assert c.wait_ready(30)
        yield c
    finally:
        c.stop()


class Reader:
    """The runner's `read(start)` over one consumer: offsets move on by the rows sealed."""

    def __init__(self, c: SourceConsumer, start: int = 0) -> None:
        self.c = c
        self.offset = start

    def read(self) -> tuple[list[Item], BatchPlan]:
        sealed: list[Item] = []
        plan = self.c.take(self.offset, lambda items, _plan: sealed.extend(items))
        assert plan.start == self.offset and plan.end == self.offset + len(sealed)
        self.offset = plan.end
        return sealed, plan

    def next_batch(self, timeout: float = 15.0) -> tuple[list[Item], BatchPlan]:
        """The next batch with rows (Spark skips empty reads)."""
        deadline = time.monotonic() + timeout
        while True:
            rows, plan = self.read()
            if rows:
                return rows, plan
            assert time.monotonic() < deadline, f"no rows within {timeout}s"

    def rows(self, n: int) -> tuple[list[Item], BatchPlan]:
        """Read batches until exactly `n` rows were handed out: (the rows, the last plan)."""
        out: list[Item] = []
        while len(out) < n:
            rows, plan = self.next_batch()
            out += rows
        assert len(out) == n, f"{len(out)} rows handed out, {n} published"
        return out, plan


def conn_name(queue: str) -> str:
    return f"ackkit-spark:{queue}"  # SourceConsumer.parameters()


def stale_tag_errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    bad = ("PRECONDITION_FAILED", "unknown delivery tag", "closed by the broker")
    return [r.getMessage() for r in caplog.records if any(b in r.getMessage() for b in bad)]


# -- written batches are acked; unwritten ones go back -----------------------------------------


@EXAMPLES
@given(n=st.integers(1, 25), max_batch=st.integers(1, 10))
def test_each_written_batch_is_acked_and_nothing_before(
    broker: Broker, queue_factory: Any, tmp_path_factory: Any, n: int, max_batch: int
) -> None:
    q = queue_factory(declare=True)
    ids = list(range(n))
    broker.publish(q, orders(ids))
    with consumer(
        broker.handle.url, q, tmp_path_factory.mktemp("ckpt"), max_batch=str(max_batch)
    ) as c:
        reader = Reader(c)
        done = 0
        seen: list[int] = []
        while done < n:
            rows, plan = reader.next_batch()
            assert len(rows) <= max_batch
            assert plan.admissions == [Admission.NEW] * len(rows)
            seen += [it.parsed["id"] for it in rows if it.parsed]
            # Taken is not settled: the batch's rows are still unacked on the broker.
            broker.wait_for(q, ready=0, unacked=n - done)
            out = c.written(plan.end)
            assert out["acked"] == len(rows) and out["stale"] == 0 and out["sent"] == 1
            assert out["frames"] == 1  # one multiple-ack per written batch
            done += len(rows)
            broker.wait_for(q, ready=0, unacked=n - done)
        assert seen == ids  # in queue order, each once
        assert c.stats()["written_upto"] == n


@EXAMPLES
@given(n=st.integers(1, 20))
def test_a_batch_taken_but_not_written_is_back_in_the_queue_after_stop(
    broker: Broker, queue_factory: Any, tmp_path_factory: Any, n: int
) -> None:
    q = queue_factory(declare=True)
    broker.publish(q, orders(list(range(n))))
    ckpt = tmp_path_factory.mktemp("ckpt")
    with consumer(broker.handle.url, q, ckpt) as c:
        rows, plan = Reader(c).rows(n)
        assert plan.end == n
        broker.wait_for(q, ready=0, unacked=n)
    broker.wait_for(q, ready=n, unacked=0)  # stop() requeued them all; none acked, none lost
    with consumer(broker.handle.url, q, ckpt) as c:  # a fresh runner, nothing logged
        again, plan = Reader(c).rows(n)
        assert [it.meta.body for it in again] == [it.meta.body for it in rows]
        assert all(it.meta.redelivered and it.meta.attempt == 2 for it in again)
        c.written(plan.end)
        broker.wait_for(q, ready=0, unacked=0)


@pytest.mark.parametrize("was_written", [False, True], ids=["unwritten", "written"])
def test_a_restarted_runner_never_hands_out_a_logged_batch_again(
    broker: Broker, queue_factory: Any, tmp_path_factory: Any, was_written: bool
) -> None:
    """The runner died after logging a batch (and, for `written`, after the sink wrote it)
    but before the ack: the broker redelivers it. The next runner restores the logged keys;
    the copies are held until the replayed batch is written, or acked at once when it was."""
    n = 6
    q = queue_factory(declare=True)
    broker.publish(q, orders(list(range(n))))
    ckpt = tmp_path_factory.mktemp("ckpt")
    with consumer(broker.handle.url, q, ckpt) as c:
        rows, plan = Reader(c).rows(n)  # logged: the runner's seal wrote them
    broker.wait_for(q, ready=n, unacked=0)
    logged = [(plan.end, [it.key for it in rows])]
    assert all(logged[0][1])  # the kit's publisher sets message ids: every row has a key
    upto = plan.end if was_written else 0
    with consumer(broker.handle.url, q, ckpt, written_upto=upto, restored=logged) as c:
        eventually(lambda: c.stats()["received"] == n, what="the redelivered copies")
        copies, next_plan = Reader(c, start=plan.end).read()
        assert copies == [] and next_plan.end == plan.end  # no row twice
        if was_written:
            assert next_plan.admissions == [Admission.SETTLED] * n
            broker.wait_for(q, ready=0, unacked=0)  # acked at take, no written needed
        else:
            assert next_plan.admissions == [Admission.HELD] * n
            broker.wait_for(q, ready=0, unacked=n)  # held until the replayed batch is written
            out = c.written(plan.end)  # Spark replays (0, end] from the log; the sink writes
            assert out["acked"] == n and out["held"] == n and out["stale"] == 0
            broker.wait_for(q, ready=0, unacked=0)
        assert c.forget(plan.end) == n  # written and acked: its keys may go


# -- invalid payloads ----------------------------------------------------------------------------

BAD = [b"not json", b"{}", b'{"id": "x"}', b"[]", b""]


@EXAMPLES
@given(mix=st.lists(st.one_of(st.integers(0, 999), st.sampled_from(BAD)), min_size=1, max_size=15))
def test_invalid_payloads_are_dead_lettered_with_a_reason_and_the_rest_batched(
    broker: Broker, queue_factory: Any, tmp_path_factory: Any, mix: list[int | bytes]
) -> None:
    q = queue_factory(declare=True)
    bodies: list[str | bytes] = [json.dumps({"id": m}) if isinstance(m, int) else m for m in mix]
    valid = [m for m in mix if isinstance(m, int)]
    invalid = [m for m in mix if isinstance(m, bytes)]
    broker.publish(q, bodies)
    ckpt = tmp_path_factory.mktemp("ckpt")
    with consumer(broker.handle.url, q, ckpt, on_invalid="dead_letter") as c:
        reader = Reader(c)
        if invalid:
            broker.wait_for(f"{q}.dlq", ready=len(invalid))
        rows, plan = reader.rows(len(valid)) if valid else ([], None)
        assert [it.parsed and it.parsed["id"] for it in rows] == valid
        assert all(it.error is None for it in rows)
        # The dead-lettered ones are acked on their own; the rows wait for written.
        broker.wait_for(q, ready=0, unacked=len(valid))
        if plan is not None:
            out = c.written(plan.end)
            assert out["acked"] == len(valid)
        broker.wait_for(q, ready=0, unacked=0)
        assert c.stats()["invalid"] == len(invalid)
    dead = broker.take_all(f"{q}.dlq")
    assert sorted(m.body for m in dead) == sorted(invalid)
    for m in dead:
        assert m.headers["ackkit-reason"].startswith("bad payload"), m.headers
        assert m.headers["ackkit-original-queue"] == q


def test_an_invalid_payload_with_on_invalid_fail_fails_the_read_and_nothing_is_acked(
    broker: Broker, queue_factory: Any, tmp_path: Path
) -> None:
    q = queue_factory(declare=True)
    broker.publish(q, [*orders([1, 2]), b"not json", *orders([3])])
    with consumer(broker.handle.url, q, tmp_path) as c:  # on_invalid defaults to fail
        eventually(lambda: c.stats()["received"] == 4, what="4 deliveries")
        with pytest.raises(SourceFailed, match="does not validate"):
            Reader(c).read()
        broker.wait_for(q, ready=0, unacked=4)
    broker.wait_for(q, ready=4, unacked=0)
    with pytest.raises(QueueNotFound):  # nothing was dead-lettered (its queue never declared)
        broker.counts(f"{q}.dlq")


def test_attempt_headers_follow_the_listeners_rules(
    broker: Broker, queue_factory: Any, tmp_path: Path
) -> None:
    """ackkit's own attempt header counts as for a listener; a forged one is dead-lettered
    with the reason, never handed out."""
    q = queue_factory(declare=True)
    broker.publish(q, orders([1]), headers={"ackkit-attempt": 3})
    broker.publish(q, orders([2]), headers={"ackkit-attempt": "garbage"})
    broker.publish(q, orders([3]), headers={"ackkit-attempt": 0})
    broker.publish(q, orders([4]))
    with consumer(broker.handle.url, q, tmp_path, on_invalid="dead_letter") as c:
        broker.wait_for(f"{q}.dlq", ready=2)
        rows, plan = Reader(c).rows(2)
        assert [(it.parsed and it.parsed["id"], it.meta.attempt) for it in rows] == [(1, 3), (4, 1)]
        c.written(plan.end)
        broker.wait_for(q, ready=0, unacked=0)
    dead = sorted(broker.take_all(f"{q}.dlq"), key=lambda m: m.body)
    assert [json.loads(m.body)["id"] for m in dead] == [2, 3]
    for m in dead:
        assert "invalid ackkit-attempt header" in m.headers["ackkit-reason"], m.headers


# -- a lost channel ----------------------------------------------------------------------------


def test_a_batch_written_after_its_channel_was_cut_acks_no_stale_tag_and_loses_nothing(
    broker: Broker, queue_factory: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The connection is force-closed between take and written: the broker requeues the
    batch. `written` sends no ack for the old channel's tags (the ledger dropped them with
    the channel); the redelivered copies are recognised as rows of the written batch and
    acked at the next take, not handed out again."""
    n = 8
    caplog.set_level(logging.INFO, logger="ackkit")
    q = queue_factory(declare=True)
    broker.publish(q, orders(list(range(n))))
    with consumer(broker.handle.url, q, tmp_path) as c:
        reader = Reader(c)
        _rows, plan = reader.rows(n)
        broker.wait_for(q, ready=0, unacked=n)
        assert broker.close_connections_named(conn_name(q)) >= 1
        eventually(lambda: c.stats()["connections"] == 2, timeout=20, what="a reconnect")
        eventually(lambda: c.stats()["received"] == 2 * n, timeout=20, what="the redeliveries")
        out = c.written(plan.end)
        # The lost channel's rows were dropped with it: nothing left to ack, no frame.
        assert out == {"acked": 0, "held": 0, "stale": 0, "frames": 0, "sent": 1}
        copies, after = reader.read()
        assert copies == [] and after.end == plan.end
        assert after.admissions == [Admission.SETTLED] * n
        broker.wait_for(q, ready=0, unacked=0, consumers=1)
        # Still consuming on the new channel: a new message is a new row.
        broker.publish(q, orders([n]))
        more, p2 = reader.rows(1)
        assert [it.parsed and it.parsed["id"] for it in more] == [n]
        c.written(p2.end)
        broker.wait_for(q, ready=0, unacked=0)
        assert c.stats()["connections"] == 2
    assert stale_tag_errors(caplog) == []


def test_a_batch_written_before_the_cut_is_noticed_loses_nothing(
    broker: Broker, queue_factory: Any, tmp_path: Path
) -> None:
    """The other order: written right after the broker closed the connection, before the
    consumer may have seen it. The ack frame may be lost; then the copies come back and are
    acked as rows of a written batch. Either way the queue ends empty, no row twice."""
    n = 8
    q = queue_factory(declare=True)
    broker.publish(q, orders(list(range(n))))
    with consumer(broker.handle.url, q, tmp_path) as c:
        reader = Reader(c)
        _rows, plan = reader.rows(n)
        assert broker.close_connections_named(conn_name(q)) >= 1
        out = c.written(plan.end)
        # Before the consumer saw the close: acked (frames into a dead socket) or stale;
        # after: dropped with the channel. Never a part of the batch.
        assert out["acked"] + out["stale"] in (0, n)

        def settled() -> bool:
            copies, _ = reader.read()  # a lost ack frame: the copies come back, acked at take
            assert copies == [], "a row of a written batch was handed out again"
            s = broker.counts(q)
            return (s.ready, s.unacked, s.consumers) == (0, 0, 1)

        eventually(settled, timeout=20, what="the queue empty, one consumer")
