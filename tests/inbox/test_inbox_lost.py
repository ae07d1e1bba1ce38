"""An inbox listener and the crash-loop bound (ackkit-lost), on a real RabbitMQ and a
real PostgreSQL, App and AsyncApp. A redelivery past the bound whose key the inbox
recorded (its run committed; only its ack was lost when its consumers died) is a
duplicate: acked, the handler not run, nothing dead-lettered. One whose key is not
recorded is dead-lettered as for any listener. The redeliveries are real: taken with
basic.get and returned by closing the connection (the broker sets redelivered)."""

from __future__ import annotations

import psycopg
import pytest

from ackkit import Retry
from ackkit._core import headers as H
from ackkit.inbox import Inbox, schema
from ackkit.testing import BrokerHandle

from ._harness import Behaviour, build, effects, effects_table, eventually, inbox_keys, running

pytestmark = pytest.mark.integration


def _redeliver(rabbitmq: BrokerHandle, queue: str, n: int) -> None:
    """Take `n` messages unacked and close the connection: the broker requeues them
    with redelivered=True, as after a consumer that died."""
    conn = rabbitmq.connect()
    try:
        ch = conn.channel()
        for _ in range(n):
            method, _props, _body = ch.basic_get(queue, auto_ack=False)
            assert method is not None
    finally:
        conn.close()


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_past_the_crash_bound_a_recorded_key_is_a_duplicate_not_a_dead_letter(
    kind: str, rabbitmq: BrokerHandle, queue_factory: object, postgres_dsn: str
) -> None:
    q = queue_factory("lost", declare=True)  # type: ignore[operator]
    effects_table(postgres_dsn)
    with psycopg.connect(postgres_dsn, autocommit=True) as c:
        c.execute(schema())
        c.execute("INSERT INTO ackkit_inbox (listener, key) VALUES ('l', 'done')")
    at_bound = {H.LOST: H.LOST_BOUND}
    rabbitmq.publish(q, b"x", message_id="done", headers=at_bound)  # committed before
    rabbitmq.publish(q, b"x", message_id="crash", headers=at_bound)  # never committed
    _redeliver(rabbitmq, q, 2)
    b = Behaviour()
    app = build(kind, rabbitmq.url, q, Inbox(postgres_dsn), b, name="l", retry=Retry())
    with running(kind, app):
        rabbitmq.wait_for(q, ready=0, unacked=0, timeout=20)
        eventually(lambda: rabbitmq.counts(f"{q}.dlq").ready == 1, what="one dead letter")
        eventually(lambda: app.stats()["l"]["duplicate"] == 1, what="one duplicate")
    letters = rabbitmq.dead_letters(f"{q}.dlq", take=True)
    assert [m.properties.message_id for m in letters] == ["crash"]
    assert letters[0].dead_letter is not None
    assert letters[0].dead_letter.reason == (
        f"consumer died or lost its connection {H.LOST_BOUND} times while handling it"
    )
    assert b.calls == 0 and effects(postgres_dsn) == []
    assert inbox_keys(postgres_dsn) == [("l", "done")]  # the look-up recorded nothing
