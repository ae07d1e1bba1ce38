"""Batch listeners with an inbox: one transaction per batch, the per-message rules still
holding (duplicates left out of the handler's list, AckIndex records only the succeeded
prefix, a raising handler rolls the batch back). On both stores (memory on the in-memory
broker, PostgreSQL on a real RabbitMQ) and both runtimes; assertions on what the broker
shows (queue counts, dead letters) and on the rows."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from ackkit import (
    AckIndex,
    App,
    AsyncApp,
    Batch,
    Consumer,
    Delivery,
    FlushPolicy,
    Retry,
    RetryStrategy,
)
from ackkit.testing import BrokerHandle

from ._harness import (
    close_connections_named,
    effects,
    effects_table,
    eventually,
    inbox_keys,
    running,
)
from .test_inbox_contract import Setup, queue, setup  # noqa: F401 (fixtures)

pytestmark = pytest.mark.one_leg  # the database is the subject, not the broker

KINDS = ["sync", "async"]

Verdict = Callable[[int, list[str]], "int | None"]
"""(call number from 1, the message ids the handler got) -> AckIndex's index, None for
all done; raises to make the handler raise."""


def all_done(n: int, mids: list[str]) -> int | None:
    return None


class Calls:
    def __init__(self, verdict: Verdict = all_done) -> None:
        self.verdict = verdict
        self.lists: list[list[str]] = []
        self.done: list[str] = []  # what the handler reported done (an in-memory inbox's effects)
        self.lock = threading.Lock()

    def decide(self, mids: list[str]) -> tuple[int | None, BaseException | None]:
        with self.lock:
            self.lists.append(mids)
            n = len(self.lists)
        try:
            return self.verdict(n, mids), None
        except Exception as exc:
            return None, exc

    def finished(self, mids: list[str], index: int | None) -> list[str]:
        ok = mids if index is None else mids[: index + 1]
        with self.lock:
            self.done.extend(ok)
        return ok

    @property
    def ran(self) -> list[str]:
        return [m for ms in self.lists for m in ms]


INSERT = "INSERT INTO effects (msg, note) VALUES (%s, txid_current()::text)"


def build_batch(
    kind: str,
    url: str,
    q: str,
    inbox: Any,
    calls: Calls,
    *,
    size: int = 10,
    timeout: float = 1.0,
    retry: Retry | None = None,
    flush: FlushPolicy | None = None,
    follow: str | None = None,
) -> Any:
    """An App or AsyncApp with one batch inbox listener named "b". The handler writes an
    effect row (with its transaction's id) for each message it reports done; a raising
    verdict writes rows for all first, then raises (they must roll back). With `follow`,
    the same for a message published to that queue (through the outbox)."""
    cname = f"inbox-batch-{kind}-{uuid.uuid4().hex[:6]}"
    retry = retry or Retry(max_attempts=3, initial_interval=0.05, strategy=RetryStrategy.IN_PROCESS)
    opts: dict[str, Any] = dict(
        inbox=inbox,
        retry=retry,
        batch=Batch(size, timeout),
        consumer=Consumer(prefetch=50, flush=flush),
        name="b",
    )

    def mids_of(bodies: list[bytes], ds: list[Delivery]) -> list[str]:
        return [d.message_id or body.decode() for body, d in zip(bodies, ds, strict=True)]

    if kind == "sync":
        app: Any = App(url, connection_name=cname)

        @app.listener(q, **opts)
        def handle(bodies: list[bytes], ds: list[Delivery]) -> AckIndex | None:
            mids = mids_of(bodies, ds)
            index, exc = calls.decide(mids)
            db = ds[0].db
            if exc is not None:
                for m, d in zip(mids, ds, strict=True):
                    if db:  # false on the in-memory inbox
                        db.execute(INSERT, (m,))
                    if follow:
                        d.publish(follow, m.encode(), message_id=f"f-{m}")
                raise exc
            ok = calls.finished(mids, index)
            for m, d in zip(ok, ds, strict=False):
                if db:  # false on the in-memory inbox
                    db.execute(INSERT, (m,))
                if follow:
                    d.publish(follow, m.encode(), message_id=f"f-{m}")
            return None if index is None else AckIndex(index)

    else:
        app = AsyncApp(url, connection_name=cname)

        @app.listener(q, **opts)
        async def ahandle(bodies: list[bytes], ds: list[Delivery]) -> AckIndex | None:
            mids = mids_of(bodies, ds)
            index, exc = calls.decide(mids)
            db = ds[0].db
            if exc is not None:
                for m, d in zip(mids, ds, strict=True):
                    if db:  # false on the in-memory inbox
                        await db.execute(INSERT, (m,))
                    if follow:
                        await d.publish(follow, m.encode(), message_id=f"f-{m}")
                raise exc
            ok = calls.finished(mids, index)
            for m, d in zip(ok, ds, strict=False):
                if db:  # false on the in-memory inbox
                    await db.execute(INSERT, (m,))
                if follow:
                    await d.publish(follow, m.encode(), message_id=f"f-{m}")
            await asyncio.sleep(0)
            return None if index is None else AckIndex(index)

    app.connection_name_for_tests = cname
    return app


def publish(broker: Any, q: str, mids: list[str]) -> None:
    for m in mids:
        broker.publish(q, m.encode(), message_id=m)


def transactions(dsn: str) -> int:
    """The distinct transactions that wrote effect rows."""
    with psycopg.connect(dsn) as c:
        row = c.execute("SELECT count(DISTINCT note) FROM effects").fetchone()
        return int(row[0]) if row else 0


def keys(s: Setup) -> list[str]:
    return [k for _, k in inbox_keys(s.dsn)] if s.pg else []


@pytest.mark.parametrize("kind", KINDS)
def test_one_transaction_per_batch(kind: str, setup: Setup, queue: str) -> None:  # noqa: F811
    calls = Calls()
    app = build_batch(kind, setup.broker.url, queue, setup.inbox(), calls, size=10, timeout=5.0)
    with running(kind, app):
        publish(setup.broker, queue, [f"m{i:02}" for i in range(20)])
        setup.broker.wait_for(queue, ready=0, unacked=0, timeout=30)
        eventually(lambda: app.stats()["b"]["acked"] == 20)
    want = [f"m{i:02}" for i in range(20)]
    assert sorted(calls.ran) == want  # each once
    assert len(calls.lists) <= 6  # batches of up to 10, not one call a message
    if setup.pg:
        assert sorted(effects(setup.dsn)) == want
        assert transactions(setup.dsn) == len(calls.lists)  # one commit per handler call
        assert keys(setup) == want


@pytest.mark.parametrize("kind", KINDS)
def test_duplicates_in_and_across_batches_are_left_out(
    kind: str,
    setup: Setup,  # noqa: F811
    queue: str,  # noqa: F811
) -> None:
    calls = Calls()
    app = build_batch(kind, setup.broker.url, queue, setup.inbox(), calls, size=10, timeout=1.0)
    with running(kind, app):
        publish(setup.broker, queue, ["a", "b", "a", "c", "b"])  # twins in one batch
        setup.broker.wait_for(queue, ready=0, unacked=0, timeout=30)
        eventually(lambda: app.stats()["b"]["acked"] == 5)
        publish(setup.broker, queue, ["a", "c", "d"])  # recorded keys in a later batch
        setup.broker.wait_for(queue, ready=0, unacked=0, timeout=30)
        eventually(lambda: app.stats()["b"]["acked"] == 8)
        stats = app.stats()["b"]
    assert sorted(calls.ran) == ["a", "b", "c", "d"]  # the handler never saw a duplicate
    assert stats["duplicate"] == 4
    assert setup.broker.counts(f"{queue}.dlq").total == 0
    if setup.pg:
        assert sorted(effects(setup.dsn)) == ["a", "b", "c", "d"]
        assert keys(setup) == ["a", "b", "c", "d"]


@pytest.mark.parametrize("kind", KINDS)
def test_ack_index_records_the_prefix_and_retries_the_rest(
    kind: str,
    setup: Setup,  # noqa: F811
    queue: str,  # noqa: F811
) -> None:
    """First call: AckIndex(1) of 5; the tail runs again (in process) and succeeds up to
    "bad", which fails every time and is dead-lettered after its 3 attempts."""

    def verdict(n: int, mids: list[str]) -> int | None:
        if n == 1:
            return 1
        if "bad" in mids:
            return mids.index("bad") - 1
        return None

    calls = Calls(verdict)
    mids = ["k0", "k1", "k2", "k3", "bad"]
    app = build_batch(kind, setup.broker.url, queue, setup.inbox(), calls, size=5, timeout=5.0)
    with running(kind, app):
        publish(setup.broker, queue, mids)
        setup.broker.wait_for(f"{queue}.dlq", ready=1, timeout=30)
        setup.broker.wait_for(queue, ready=0, unacked=0, timeout=30)
    assert calls.lists[0] == mids
    assert calls.lists[1] == ["k2", "k3", "bad"]  # the tail, run again
    assert calls.lists[2:] == [["bad"]]  # its third attempt, then the DLQ
    assert sorted(calls.done) == ["k0", "k1", "k2", "k3"]
    dead = setup.broker.dead_letters(f"{queue}.dlq")
    assert [m.body for m in dead] == [b"bad"]
    if setup.pg:
        assert sorted(effects(setup.dsn)) == ["k0", "k1", "k2", "k3"]
        assert keys(setup) == ["k0", "k1", "k2", "k3"]  # never the failed "bad"


@pytest.mark.parametrize("kind", KINDS)
def test_a_raising_batch_rolls_back_and_is_retried(
    kind: str,
    setup: Setup,  # noqa: F811
    queue: str,  # noqa: F811
) -> None:
    def verdict(n: int, mids: list[str]) -> int | None:
        if n == 1:
            raise RuntimeError("boom")
        return None

    calls = Calls(verdict)
    mids = ["r0", "r1", "r2"]
    app = build_batch(kind, setup.broker.url, queue, setup.inbox(), calls, size=3, timeout=5.0)
    with running(kind, app):
        publish(setup.broker, queue, mids)
        setup.broker.wait_for(queue, ready=0, unacked=0, timeout=30)
        eventually(lambda: app.stats()["b"]["acked"] == 3)
    assert calls.lists == [mids, mids]
    assert setup.broker.counts(f"{queue}.dlq").total == 0
    if setup.pg:  # the first call's rows rolled back: once each
        assert sorted(effects(setup.dsn)) == mids
        assert transactions(setup.dsn) == 1
        assert keys(setup) == mids


@pytest.mark.parametrize("kind", KINDS)
def test_a_raising_batch_with_a_recorded_key_acks_it_as_a_duplicate(
    kind: str,
    setup: Setup,  # noqa: F811
    queue: str,  # noqa: F811
) -> None:
    """Always raising, max 2 attempts: the new keys are dead-lettered, the one recorded
    before is acked as a duplicate, never dead-lettered."""

    def verdict(n: int, mids: list[str]) -> int | None:
        if n == 1:
            return None
        raise RuntimeError("boom")

    calls = Calls(verdict)
    retry = Retry(max_attempts=2, initial_interval=0.05, strategy=RetryStrategy.IN_PROCESS)
    app = build_batch(
        kind, setup.broker.url, queue, setup.inbox(), calls, size=3, timeout=5.0, retry=retry
    )
    with running(kind, app):
        publish(setup.broker, queue, ["old"])
        setup.broker.wait_for(queue, ready=0, unacked=0, timeout=30)
        publish(setup.broker, queue, ["old", "n1", "n2"])
        setup.broker.wait_for(f"{queue}.dlq", ready=2, timeout=30)
        setup.broker.wait_for(queue, ready=0, unacked=0, timeout=30)
        stats = app.stats()["b"]
    assert stats["duplicate"] == 1
    assert sorted(m.body for m in setup.broker.dead_letters(f"{queue}.dlq")) == [b"n1", b"n2"]
    assert [m for ms in calls.lists[1:] for m in ms] == ["n1", "n2", "n1", "n2"]
    if setup.pg:
        assert effects(setup.dsn) == ["old"] and keys(setup) == ["old"]


@pytest.mark.parametrize("kind", KINDS)
def test_no_key_in_a_batch_is_dead_lettered_alone(
    kind: str,
    setup: Setup,  # noqa: F811
    queue: str,  # noqa: F811
) -> None:
    calls = Calls()
    app = build_batch(kind, setup.broker.url, queue, setup.inbox(), calls, size=3, timeout=2.0)
    with running(kind, app):
        setup.broker.publish(queue, b"x1", message_id="x1")
        setup.broker.publish(queue, b"nokey", message_id=None)
        setup.broker.publish(queue, b"x2", message_id="x2")
        setup.broker.wait_for(f"{queue}.dlq", ready=1, timeout=30)
        setup.broker.wait_for(queue, ready=0, unacked=0, timeout=30)
    assert sorted(calls.ran) == ["x1", "x2"]
    dead = setup.broker.dead_letters(f"{queue}.dlq")
    assert [m.body for m in dead] == [b"nokey"]
    assert "no inbox key" in (dead[0].reason or "")


@pytest.mark.integration
@pytest.mark.parametrize("kind", KINDS)
def test_a_batch_redelivered_after_a_connection_cut_is_all_duplicates(
    kind: str, rabbitmq: BrokerHandle, fresh_queue: str, postgres_dsn: str
) -> None:
    """Acks held back (see test_inbox_pg's cut test): the batch committed, the acks not
    sent; the connection is cut, the broker redelivers the batch: all acked as
    duplicates, the handler not run again."""
    effects_table(postgres_dsn)
    from ackkit.inbox import Inbox

    calls = Calls()
    hold = FlushPolicy(max_pending=1000, interval=3600.0)
    mids = [f"c{i}" for i in range(5)]
    app = build_batch(
        kind, rabbitmq.url, fresh_queue, Inbox(postgres_dsn), calls, size=5, timeout=5.0, flush=hold
    )
    with running(kind, app):
        publish(rabbitmq, fresh_queue, mids)
        eventually(lambda: len(effects(postgres_dsn)) == 5, what="5 committed")
        assert rabbitmq.counts(fresh_queue).unacked == 5  # committed, not acked
        assert close_connections_named(rabbitmq, app.connection_name_for_tests) == 1
        try:
            eventually(lambda: app.stats()["b"]["duplicate"] == 5, timeout=60, what="5 dups")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; stats: {app.stats()['b']}") from None
    rabbitmq.wait_for(fresh_queue, ready=0, unacked=0, timeout=30)
    assert sorted(effects(postgres_dsn)) == mids
    assert calls.lists == [mids]  # never run again
    assert transactions(postgres_dsn) == 1


@pytest.mark.integration
@pytest.mark.parametrize("kind", KINDS)
def test_database_down_returns_the_batch_unstarted_and_pauses(
    kind: str, rabbitmq: BrokerHandle, fresh_queue: str, postgres: Any, postgres_dsn: str
) -> None:
    """As for single deliveries: the batch goes back to the queue (no attempt, nothing
    dead-lettered), the listener pauses, and resumes when the database answers."""
    if not postgres.own:
        pytest.skip("needs the kit's own PostgreSQL (it is stopped and started)")
    effects_table(postgres_dsn)
    from ackkit.inbox import Inbox

    calls = Calls()
    retry = Retry(max_attempts=1)
    app = build_batch(
        kind,
        rabbitmq.url,
        fresh_queue,
        Inbox(postgres_dsn),
        calls,
        size=5,
        timeout=0.5,
        retry=retry,
    )
    with running(kind, app):
        publish(rabbitmq, fresh_queue, ["before"])
        eventually(lambda: effects(postgres_dsn) == ["before"])
        postgres.stop()
        try:
            publish(rabbitmq, fresh_queue, [f"down{i}" for i in range(5)])
            eventually(lambda: app.flow_state()["b"].value == "paused", what="paused")
            rabbitmq.wait_for(fresh_queue, ready=5, consumers=0, timeout=30)
            assert rabbitmq.counts(f"{fresh_queue}.dlq").total == 0
        finally:
            postgres.start()
        rabbitmq.wait_for(fresh_queue, ready=0, unacked=0, consumers=1, timeout=60)
        eventually(lambda: len(effects(postgres_dsn)) == 6, what="6 rows")
        stats = app.stats()["b"]
    assert sorted(effects(postgres_dsn)) == ["before", *(f"down{i}" for i in range(5))]
    assert rabbitmq.counts(f"{fresh_queue}.dlq").total == 0
    assert stats["dead_lettered"] == 0


@pytest.mark.integration
@pytest.mark.parametrize("kind", KINDS)
def test_outbox_messages_of_a_batch_follow_its_commit(
    kind: str, rabbitmq: BrokerHandle, queue_factory: Any, postgres_dsn: str
) -> None:
    """A raising first call publishes for all (rolled back: nothing sent); then
    AckIndex(0) of 3 (only o0's follow-up sent), then the rest: each follow-up once."""

    def verdict(n: int, mids: list[str]) -> int | None:
        if n == 1:
            raise RuntimeError("boom")
        return 0 if n == 2 else None

    effects_table(postgres_dsn)
    from ackkit.inbox import Inbox

    q1, q2 = queue_factory("batch"), queue_factory("follow", declare=True)
    calls = Calls(verdict)
    retry = Retry(max_attempts=5, initial_interval=0.05, strategy=RetryStrategy.IN_PROCESS)
    app = build_batch(
        kind,
        rabbitmq.url,
        q1,
        Inbox(postgres_dsn),
        calls,
        size=3,
        timeout=5.0,
        retry=retry,
        follow=q2,
    )
    mids = ["o0", "o1", "o2"]
    with running(kind, app):
        publish(rabbitmq, q1, mids)
        rabbitmq.wait_for(q1, ready=0, unacked=0, timeout=30)
        rabbitmq.wait_for(q2, ready=3, timeout=30)
    assert calls.lists == [mids, mids, ["o1", "o2"]]
    sent = rabbitmq.messages(q2)
    assert sorted(m.body for m in sent) == [b"o0", b"o1", b"o2"]
    assert sorted(effects(postgres_dsn)) == mids
