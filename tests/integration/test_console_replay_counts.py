"""When a replay or delete says done, the broker's count of the DLQ already agrees.

The console acks on its holding channels; the channel hands each ack on to the queue
process, which takes it in later (and answers count queries before pending acks). A
round trip on the channel alone returned while the queue still counted thousands of the
replayed dead letters (seen as 100 s to 3.5 min with 100,000 held)."""

from __future__ import annotations

from typing import Any

import pika
import pytest
from _retry_support import drain, publish, wait_until

from ackkit._core import headers as H
from ackkit.console import Holder, Store

pytestmark = pytest.mark.integration
N = 12_000


def fill(url: str, dlq: str, parking: str) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    ch.queue_declare(dlq, durable=True)
    for i in range(N):
        h = {H.REASON: "x", H.ERROR_TYPE: ("KeyError", "ValueError", "OSError")[i % 3],
             H.ERROR_MESSAGE: f"'k{i}'", H.ORIGINAL_QUEUE: parking}  # fmt: skip
        props = pika.BasicProperties(message_id=f"m{i}", headers=h, delivery_mode=2)
        ch.basic_publish("", dlq, b'{"note": "%d"}' % i, props)
        if i % 2000 == 1999:
            conn.process_data_events(0)
    conn.close()


def test_after_a_replay_or_delete_says_done_the_broker_count_agrees(
    rabbitmq: Any, fresh_queue: str
) -> None:
    dlq, parking = f"{fresh_queue}.dlq", f"{fresh_queue}.parking"
    publish(rabbitmq.url, parking, b"", declare=True)
    drain(rabbitmq.url, parking)
    fill(rabbitmq.url, dlq, parking)
    rabbitmq.wait_for(dlq, ready=N, timeout=60)
    holder = Holder(rabbitmq.url, [dlq], Store([dlq]))
    holder.start()
    try:
        assert wait_until(lambda: holder.store.held(dlq) == N, timeout=120)
        groups = {g.key.error_type: g.id for g in holder.store.groups()}
        res = holder.replay(holder.store.group_ids(groups["KeyError"]), None, "t").result(300)
        assert res.done == N // 3, res.summary()
        c = rabbitmq.counts(dlq)  # asked at once: no waiting for the broker to catch up
        assert (c.total, c.unacked, c.ready) == (N - N // 3, N - N // 3, 0)
        res = holder.delete(holder.store.group_ids(groups["ValueError"]), "t").result(300)
        assert res.done == N // 3, res.summary()
        c = rabbitmq.counts(dlq)
        assert (c.total, c.unacked, c.ready) == (N // 3, N // 3, 0)
        rabbitmq.wait_for(parking, ready=N // 3, timeout=60)
    finally:
        holder.stop()
    rabbitmq.wait_for(dlq, ready=N // 3, unacked=0, timeout=60)
