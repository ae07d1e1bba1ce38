"""Dead letters whose broker records name their queue next to garbage are replayed there
(read back from the broker)."""

from __future__ import annotations

from typing import Any

import pika
import pytest
from _retry_support import channel, drain

from ackkit._dlq import DeadLetterQueue

pytestmark = pytest.mark.integration


def test_garbage_next_to_a_valid_origin_does_not_stop_the_replay(
    rabbitmq: Any, queue_factory: Any
) -> None:
    q = queue_factory(declare=True)
    dlq = queue_factory(declare=True)
    cases = [
        {"x-death": [{"queue": q, "routing-keys": 5, "count": "x", "exchange": 3}]},
        {"x-death": [{"routing-keys": 5}, {"queue": q, "reason": [1]}]},
        {"ackkit-reason": 7, "ackkit-original-queue": 12, "x-death": [{"queue": q}]},
        {"x-death": "garbage", "x-first-death-queue": q},
    ]
    with channel(rabbitmq.url) as ch:
        for i, headers in enumerate(cases):
            props = pika.BasicProperties(message_id=f"m{i}", headers=headers)
            ch.basic_publish("", dlq, b"x", props)
    with DeadLetterQueue(rabbitmq.url, dlq) as d:
        report = d.replay()
    assert (report.replayed, report.no_target, report.remaining) == (len(cases), 0, 0), report
    assert sorted(p.message_id for p, _ in drain(rabbitmq.url, q)) == ["m0", "m1", "m2", "m3"]
