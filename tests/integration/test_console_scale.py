"""The console with a few thousand dead letters on two holding channels: a replay of
several windows acks exactly what it copied (checked on the broker after it stopped)."""

from __future__ import annotations

from typing import Any

import pika
import pytest
from _retry_support import drain, publish, wait_until

from ackkit._core import headers as H
from ackkit.console import Holder, Store

pytestmark = pytest.mark.integration
N = 3000


@pytest.mark.parametrize("max_held", [N, 100_000], ids=["one-channel", "two-channels"])
def test_a_replay_of_many_windows_acks_exactly_what_it_copied(
    rabbitmq: Any, fresh_queue: str, max_held: int
) -> None:
    dlq, parking = f"{fresh_queue}.dlq", f"{fresh_queue}.parking"
    publish(rabbitmq.url, parking, b"", declare=True)
    drain(rabbitmq.url, parking)
    conn = pika.BlockingConnection(pika.URLParameters(rabbitmq.url))
    ch = conn.channel()
    ch.queue_declare(dlq, durable=True)
    for i in range(N):
        h = {H.REASON: "x", H.ERROR_TYPE: "KeyError" if i % 3 else "ValueError",
             H.ERROR_MESSAGE: f"'k{i}'", H.ORIGINAL_QUEUE: parking}  # fmt: skip
        ch.basic_publish(
            "", dlq, f"{i}".encode(), pika.BasicProperties(message_id=f"m{i}", headers=h)
        )
    conn.close()
    rabbitmq.wait_for(dlq, ready=N, timeout=30)
    holder = Holder(rabbitmq.url, [dlq], Store([dlq]), max_held=max_held)
    holder.start()
    try:
        assert wait_until(lambda: holder.store.held(dlq) == N, timeout=60)
        (gid,) = [g.id for g in holder.store.groups() if g.key.error_type == "KeyError"]
        res = holder.replay(holder.store.group_ids(gid), None, "t").result(120)
        assert (res.done, res.failed, res.gone) == (2000, 0, 0), res.summary()
        rabbitmq.wait_for(parking, ready=2000, timeout=30)
        rabbitmq.wait_for(dlq, ready=0, unacked=N - 2000, timeout=30)
        assert holder.store.errors == []
    finally:
        holder.stop()
    rabbitmq.wait_for(dlq, ready=N - 2000, unacked=0, timeout=60)
