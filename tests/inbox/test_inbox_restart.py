"""PostgreSQL restarted while an inbox listener consumes (App and AsyncApp, a real
RabbitMQ and the kit's own PostgreSQL): transactions in flight fail, the listener
pauses and returns its deliveries, a probe resumes it once the database answers. In
the end the broker holds nothing (ready and unacked 0, nothing dead-lettered) and
every message's effect row is there exactly once."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import pytest

from ackkit.inbox import Inbox
from ackkit.testing import BrokerHandle

from ._harness import Behaviour, build, effects, effects_table, eventually, running

pytestmark = [pytest.mark.integration, pytest.mark.one_leg]

N = 600


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_postgres_restart_mid_run_leaves_no_delivery_behind(
    kind: str, rabbitmq: BrokerHandle, fresh_queue: str, postgres: Any, postgres_dsn: str
) -> None:
    if not postgres.own:
        pytest.skip("needs the kit's own PostgreSQL (it is stopped and started)")
    dsn = postgres_dsn
    effects_table(dsn)
    # handlers after the 20th wait until the database is stopped: the restart lands
    # mid-run on any machine (a loaded one once finished the 600 while pg_ctl stopped)
    b = Behaviour(sleep=0.05, stall_after=20)
    app = build(kind, rabbitmq.url, fresh_queue, Inbox(dsn), b, name="l", concurrency=4)
    ids = [f"r{i}" for i in range(N)]
    with running(kind, app):
        for i in ids:
            rabbitmq.publish(fresh_queue, b"x", message_id=i)
        eventually(lambda: len(effects(dsn)) >= 20, what="20 effects before the restart")
        postgres.stop()  # transactions in flight fail; new ones cannot connect
        b.released.set()
        try:
            paused = lambda: app.stats()["l"]["paused"] >= 1  # noqa: E731
            eventually(paused, timeout=30, what="the listener paused")
            time.sleep(0.5)
        finally:
            postgres.start()
        last: list[Any] = []

        def drained() -> bool:
            c = rabbitmq.counts(fresh_queue)
            last[:] = [c, app.flow_state()["l"].value, app.stats()["l"]]
            return c.ready == c.unacked == 0 and len(effects(dsn)) >= N

        try:
            eventually(drained, timeout=60, what="the queue drained")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; last: {last}") from None
        stats = app.stats()["l"]
    rows = Counter(effects(dsn))
    assert sorted(rows) == sorted(ids)
    assert set(rows.values()) == {1}
    c = rabbitmq.counts(fresh_queue)
    assert c.ready == c.unacked == 0
    assert rabbitmq.counts(f"{fresh_queue}.dlq").total == 0
    assert stats["resumed"] == stats["paused"] >= 1
