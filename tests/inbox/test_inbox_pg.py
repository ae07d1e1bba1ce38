"""The inbox on a real PostgreSQL and a real RabbitMQ, on App and AsyncApp: effects
exactly once under duplicate publishes and concurrent twins, rollback + retry + DLQ,
a message without a key, a database that goes down. Rows are read with SELECT, queue
counts and dead letters from the broker."""

from __future__ import annotations

import contextlib
import time
from typing import Any

import pytest

from ackkit import Delivery, FlushPolicy, Retry, RetryStrategy
from ackkit.inbox import Inbox, MissingKey
from ackkit.testing import BrokerHandle

from ._harness import (
    Behaviour,
    build,
    close_connections_named,
    effects,
    effects_table,
    eventually,
    inbox_keys,
    running,
)

pytestmark = [pytest.mark.integration, pytest.mark.one_leg]

KINDS = ["sync", "async"]


@pytest.fixture
def dsn(postgres_dsn: str) -> str:
    effects_table(postgres_dsn)
    return postgres_dsn


@pytest.mark.parametrize("kind", KINDS)
def test_duplicate_publishes_run_the_handler_once(
    kind: str, rabbitmq: BrokerHandle, fresh_queue: str, dsn: str
) -> None:
    b = Behaviour()
    app = build(kind, rabbitmq.url, fresh_queue, Inbox(dsn), b, name="orders")
    with running(kind, app):
        for mid in ["m1", "m2", "m1", "m1", "m3", "m2"]:
            rabbitmq.publish(fresh_queue, b"x", message_id=mid)
        rabbitmq.wait_for(fresh_queue, ready=0, unacked=0, timeout=20)
        eventually(lambda: app.stats()["orders"]["acked"] == 6, what="6 acks")
        stats = app.stats()["orders"]
    assert sorted(effects(dsn)) == ["m1", "m2", "m3"]
    assert inbox_keys(dsn) == [("orders", "m1"), ("orders", "m2"), ("orders", "m3")]
    assert b.calls == 3
    assert stats["duplicate"] == 3
    assert rabbitmq.counts(f"{fresh_queue}.dlq").total == 0


@pytest.mark.parametrize("kind", KINDS)
def test_handler_error_rolls_back_then_retry_commits_once(
    kind: str, rabbitmq: BrokerHandle, fresh_queue: str, dsn: str
) -> None:
    b = Behaviour(fail_times=2)
    app = build(kind, rabbitmq.url, fresh_queue, Inbox(dsn), b, name="l")
    with running(kind, app):
        rabbitmq.publish(fresh_queue, b"x", message_id="k1")
        rabbitmq.wait_for(fresh_queue, ready=0, unacked=0, timeout=20)
        eventually(lambda: app.stats()["l"]["acked"] == 1)
    assert b.calls == 3  # two failures rolled back their row, the third committed
    assert effects(dsn) == ["k1"]
    assert inbox_keys(dsn) == [("l", "k1")]


@pytest.mark.parametrize("kind", KINDS)
def test_exhausted_message_is_dead_lettered_and_leaves_no_row(
    kind: str, rabbitmq: BrokerHandle, fresh_queue: str, dsn: str
) -> None:
    b = Behaviour(always_fail=True)
    app = build(kind, rabbitmq.url, fresh_queue, Inbox(dsn), b, name="l")
    with running(kind, app):
        rabbitmq.publish(fresh_queue, b"x", message_id="k1")
        rabbitmq.wait_for(f"{fresh_queue}.dlq", ready=1, timeout=20)
        rabbitmq.wait_for(fresh_queue, ready=0, unacked=0, timeout=20)
    assert b.calls == 3
    assert effects(dsn) == []
    assert inbox_keys(dsn) == []


@pytest.mark.parametrize("kind", KINDS)
def test_message_without_key_is_dead_lettered_unrun_or_run_by_option(
    kind: str, rabbitmq: BrokerHandle, fresh_queue: str, queue_factory: Any, dsn: str
) -> None:
    b = Behaviour()
    app = build(kind, rabbitmq.url, fresh_queue, Inbox(dsn), b, name="l")
    with running(kind, app):
        rabbitmq.publish(fresh_queue, b"nokey", message_id=None)
        rabbitmq.wait_for(f"{fresh_queue}.dlq", ready=1, timeout=20)
    dead = rabbitmq.dead_letters(f"{fresh_queue}.dlq")
    assert "no inbox key" in (dead[0].reason or "")
    assert b.calls == 0 and effects(dsn) == []

    q2 = queue_factory("run")
    b2 = Behaviour()
    app2 = build(kind, rabbitmq.url, q2, Inbox(dsn, missing_key=MissingKey.RUN), b2, name="l2")
    with running(kind, app2):
        rabbitmq.publish(q2, b"nokey2", message_id=None)
        rabbitmq.wait_for(q2, ready=0, unacked=0, timeout=20)
        eventually(lambda: b2.calls == 1)
    assert effects(dsn) == ["nokey2"]
    assert inbox_keys(dsn) == []


@pytest.mark.parametrize("kind", KINDS)
def test_concurrent_twins_on_two_consumers_commit_once(
    kind: str, rabbitmq: BrokerHandle, fresh_queue: str, dsn: str
) -> None:
    """Two apps consume one queue; each message is published twice at once. The twin
    that claims the key second waits for the first's commit and is acked as a duplicate."""
    b = Behaviour(sleep=0.3)
    apps = [build(kind, rabbitmq.url, fresh_queue, Inbox(dsn), b, name="l") for _ in range(2)]
    with running(kind, apps[0]), running(kind, apps[1]):
        rabbitmq.wait_for(fresh_queue, consumers=2, timeout=20)
        for i in range(10):
            rabbitmq.publish_many(fresh_queue, [b"x", b"x"], message_id=f"t{i}")
        rabbitmq.wait_for(fresh_queue, ready=0, unacked=0, timeout=40)
        eventually(lambda: sum(a.stats()["l"]["acked"] for a in apps) == 20)
        dups = sum(a.stats()["l"]["duplicate"] for a in apps)
    assert sorted(effects(dsn)) == sorted(f"t{i}" for i in range(10))
    assert dups == 10
    assert len(inbox_keys(dsn)) == 10


@pytest.mark.parametrize("kind", KINDS)
def test_database_down_pauses_the_listener_without_burning_attempts(
    kind: str, rabbitmq: BrokerHandle, fresh_queue: str, postgres: Any, dsn: str
) -> None:
    if not postgres.own:
        pytest.skip("needs the kit's own PostgreSQL (it is stopped and started)")
    b = Behaviour()
    retry = Retry(max_attempts=2, initial_interval=0.05, strategy=RetryStrategy.IN_PROCESS)
    app = build(kind, rabbitmq.url, fresh_queue, Inbox(dsn), b, name="l", retry=retry)
    with running(kind, app):
        rabbitmq.publish(fresh_queue, b"x", message_id="before")
        eventually(lambda: effects(dsn) == ["before"])
        postgres.stop()
        try:
            for i in range(5):
                rabbitmq.publish(fresh_queue, b"x", message_id=f"down{i}")
            eventually(lambda: app.flow_state()["l"].value == "paused", what="paused")
            rabbitmq.wait_for(fresh_queue, ready=5, consumers=0, timeout=20)
            time.sleep(1.0)  # still paused, nothing dead-lettered
            assert rabbitmq.counts(f"{fresh_queue}.dlq").total == 0
        finally:
            postgres.start()
        rabbitmq.wait_for(fresh_queue, ready=0, unacked=0, consumers=1, timeout=30)
        eventually(lambda: app.stats()["l"]["acked"] == 6, what="6 acks")
        stats = app.stats()["l"]
    assert sorted(effects(dsn)) == ["before", *(f"down{i}" for i in range(5))]
    assert rabbitmq.counts(f"{fresh_queue}.dlq").total == 0
    assert stats["dead_lettered"] == 0 and stats["retrying"] == 0


@pytest.mark.parametrize("kind", KINDS)
def test_connection_cut_between_commit_and_ack_redelivers_as_duplicate(
    kind: str, rabbitmq: BrokerHandle, fresh_queue: str, dsn: str
) -> None:
    """Acks held back (a long flush interval): the transactions committed, the acks not
    sent, then the connection is cut. The broker redelivers all of them; the inbox acks
    them as duplicates without running the handler again.

    The acks are held for the longest interval there is: on a loaded machine the two
    rabbitmqctl calls of the cut took 33 to 100 s, and with 30 s the acks went out
    before it (acked 5, received 5, nothing to redeliver, the test timed out)."""
    b = Behaviour()
    hold = FlushPolicy(max_pending=1000, interval=3600.0)
    app = build(kind, rabbitmq.url, fresh_queue, Inbox(dsn), b, name="l", flush=hold)
    with running(kind, app):
        for i in range(5):
            rabbitmq.publish(fresh_queue, b"x", message_id=f"c{i}")
        eventually(lambda: len(effects(dsn)) == 5, what="5 commits")
        assert rabbitmq.counts(fresh_queue).unacked == 5  # committed, not acked
        assert close_connections_named(rabbitmq, app.connection_name_for_tests) == 1
        try:
            eventually(lambda: app.stats()["l"]["duplicate"] == 5, timeout=30, what="5 dups")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; stats: {app.stats()['l']}") from None
        assert app.stats()["l"]["received"] == 15  # 5, their 5 redeliveries, 5 restamped
    rabbitmq.wait_for(fresh_queue, ready=0, unacked=0, timeout=20)
    assert sorted(effects(dsn)) == [f"c{i}" for i in range(5)]
    assert b.calls == 5


SERIALIZATION_FAILURE = "DO $$ BEGIN RAISE EXCEPTION 'forced' USING ERRCODE = '40001'; END $$"


@pytest.mark.parametrize("kind", KINDS)
def test_serialization_failures_are_retried_in_process_not_attempts(
    kind: str, rabbitmq: BrokerHandle, fresh_queue: str, dsn: str
) -> None:
    """The server raises SQLSTATE 40001 in the handler's first two transactions: they
    roll back and run again in process; with max_attempts=1 the message still commits
    once, nothing is retried or dead-lettered."""
    import uuid

    from ackkit import App, AsyncApp

    calls = {"n": 0}
    one = Retry(max_attempts=1)
    if kind == "sync":
        app: Any = App(rabbitmq.url, connection_name=f"ser-{uuid.uuid4().hex[:6]}")

        @app.listener(fresh_queue, inbox=Inbox(dsn), retry=one, name="l")
        def handle(body: bytes, d: Delivery) -> None:
            calls["n"] += 1
            d.db.execute("INSERT INTO effects (msg) VALUES (%s)", (d.message_id,))
            if calls["n"] <= 2:
                d.db.execute(SERIALIZATION_FAILURE)

    else:
        app = AsyncApp(rabbitmq.url, connection_name=f"ser-{uuid.uuid4().hex[:6]}")

        @app.listener(fresh_queue, inbox=Inbox(dsn), retry=one, name="l")
        async def ahandle(body: bytes, d: Delivery) -> None:
            calls["n"] += 1
            await d.db.execute("INSERT INTO effects (msg) VALUES (%s)", (d.message_id,))
            if calls["n"] <= 2:
                await d.db.execute(SERIALIZATION_FAILURE)

    with running(kind, app):
        rabbitmq.publish(fresh_queue, b"x", message_id="s1")
        rabbitmq.wait_for(fresh_queue, ready=0, unacked=0, timeout=20)
        eventually(lambda: app.stats()["l"]["acked"] == 1)
        stats = app.stats()["l"]
    assert calls["n"] == 3
    assert effects(dsn) == ["s1"]
    assert stats["retrying"] == 0 and stats["dead_lettered"] == 0
    assert rabbitmq.counts(f"{fresh_queue}.dlq").total == 0


@pytest.mark.parametrize("kind", KINDS)
def test_tables_missing_stand_the_listener_by_until_the_migration_runs(
    kind: str, rabbitmq: BrokerHandle, fresh_queue: str, dsn: str
) -> None:
    """`create_tables=False` before the migration: an environment fault. Nothing is
    dead-lettered and no attempt is spent; the listener pauses, and once the tables
    exist it resumes and runs the message."""
    import secrets

    import psycopg

    from ackkit.inbox import schema

    name = f"inbox_{secrets.token_hex(4)}"
    inbox = Inbox(dsn, table=name, outbox_table=f"{name}_out", create_tables=False)
    b = Behaviour()
    retry = Retry(max_attempts=2, initial_interval=0.05, strategy=RetryStrategy.IN_PROCESS)
    app = build(kind, rabbitmq.url, fresh_queue, inbox, b, name="l", retry=retry)
    with running(kind, app):
        rabbitmq.publish(fresh_queue, b"x", message_id="m1")
        eventually(lambda: app.flow_state()["l"].value == "paused", what="paused")
        rabbitmq.wait_for(fresh_queue, ready=1, unacked=0, consumers=0, timeout=20)
        assert rabbitmq.counts(f"{fresh_queue}.dlq").total == 0
        assert b.calls == 0
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute(schema(name, f"{name}_out"))  # the migration
        rabbitmq.wait_for(fresh_queue, ready=0, unacked=0, consumers=1, timeout=30)
        eventually(lambda: app.stats()["l"]["acked"] == 1, what="acked")
        # an operator drops the table while the listener runs: the same stand-by
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute(f"DROP TABLE {name}")
        rabbitmq.publish(fresh_queue, b"x", message_id="m2")
        eventually(lambda: app.flow_state()["l"].value == "paused", what="paused again")
        rabbitmq.wait_for(fresh_queue, ready=1, unacked=0, consumers=0, timeout=20)
        assert rabbitmq.counts(f"{fresh_queue}.dlq").total == 0
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute(schema(name, f"{name}_out"))
        rabbitmq.wait_for(fresh_queue, ready=0, unacked=0, consumers=1, timeout=30)
        eventually(lambda: app.stats()["l"]["acked"] == 2, what="acked")
        stats = app.stats()["l"]
    assert effects(dsn) == ["m1", "m2"]
    assert inbox_keys(dsn, name) == [("l", "m2")]  # m1's row went with the table
    assert rabbitmq.counts(f"{fresh_queue}.dlq").total == 0
    assert stats["dead_lettered"] == 0


@pytest.mark.parametrize("kind", KINDS)
def test_a_handlers_own_missing_table_is_its_failure(
    kind: str, rabbitmq: BrokerHandle, fresh_queue: str, dsn: str
) -> None:
    """A table the handler's SQL names is the handler's failure (retried, then
    dead-lettered), not a reason to stand by: only the inbox's own tables are."""
    from ackkit import App, AsyncApp

    retry = Retry(max_attempts=2, initial_interval=0.05, strategy=RetryStrategy.IN_PROCESS)
    if kind == "sync":
        app: Any = App(rabbitmq.url)

        @app.listener(fresh_queue, inbox=Inbox(dsn), retry=retry, name="l")
        def handle(body: bytes, d: Delivery) -> None:
            d.db.execute("INSERT INTO no_such_table VALUES (1)")

    else:
        app = AsyncApp(rabbitmq.url)

        @app.listener(fresh_queue, inbox=Inbox(dsn), retry=retry, name="l")
        async def ahandle(body: bytes, d: Delivery) -> None:
            await d.db.execute("INSERT INTO no_such_table VALUES (1)")

    with running(kind, app):
        rabbitmq.publish(fresh_queue, b"x", message_id="m1")
        rabbitmq.wait_for(f"{fresh_queue}.dlq", ready=1, timeout=20)
        assert app.flow_state()["l"].value != "paused"
    dead = rabbitmq.dead_letters(f"{fresh_queue}.dlq")[0]
    assert dead.dead_letter is not None
    assert "UndefinedTable" in (dead.dead_letter.error_type or "")


@pytest.mark.parametrize("kind", KINDS)
def test_a_swallowed_database_error_has_a_public_name(
    kind: str, rabbitmq: BrokerHandle, fresh_queue: str, dsn: str
) -> None:
    """`ackkit.inbox.SwallowedDatabaseError`: the type a dead letter names, and one a
    user can put in Retry(fatal=...) to dead-letter at once."""
    from ackkit import App, AsyncApp
    from ackkit.inbox import SwallowedDatabaseError

    calls: list[int] = []
    retry = Retry(max_attempts=5, initial_interval=0.05, fatal=(SwallowedDatabaseError,))
    if kind == "sync":
        app: Any = App(rabbitmq.url)

        @app.listener(fresh_queue, inbox=Inbox(dsn), retry=retry, name="l")
        def handle(body: bytes, d: Delivery) -> None:
            calls.append(1)
            with contextlib.suppress(Exception):  # swallowed: the transaction is aborted
                d.db.execute("SELECT 1/0")

    else:
        app = AsyncApp(rabbitmq.url)

        @app.listener(fresh_queue, inbox=Inbox(dsn), retry=retry, name="l")
        async def ahandle(body: bytes, d: Delivery) -> None:
            calls.append(1)
            with contextlib.suppress(Exception):
                await d.db.execute("SELECT 1/0")

    with running(kind, app):
        rabbitmq.publish(fresh_queue, b"x", message_id="m1")
        rabbitmq.wait_for(f"{fresh_queue}.dlq", ready=1, timeout=20)
    dead = rabbitmq.dead_letters(f"{fresh_queue}.dlq")[0]
    assert dead.dead_letter is not None
    assert dead.dead_letter.error_type == "ackkit.inbox.SwallowedDatabaseError"
    assert len(calls) == 1  # fatal: no second attempt
