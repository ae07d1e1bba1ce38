"""Dead letters whose broker records name their queue next to garbage are replayed there
(read back from the broker)."""

from __future__ import annotations

from typing import Any

import pika
import pytest
from _retry_support import channel, drain

from ackkit.dead_letters._queue import DeadLetterQueue
from tests.adversarial.rawamqp import Field

pytestmark = [pytest.mark.integration, pytest.mark.one_leg]


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


HALF_GARBAGE = {
    # what pika cannot read whole: the table was left out, and the origin with it
    "a timestamp past year 9999": lambda q: [{"queue": q, "time": Field("T", 2**40)}],
    "a name that is not UTF-8": lambda q: [{b"\xff\xfe": 1, "queue": q}],
    "a junk entry first": lambda q: [{b"\xff": 1}, {"queue": q, "reason": "rejected"}],
    # what pika reads, in a shape other than the broker's
    "a table, not a list": lambda q: {"queue": q, "count": "x"},
    "tables in a nested list": lambda q: [[{"queue": q}], 5],
}


def test_ackkit_dlq_replay_puts_half_garbage_letters_back_on_their_queue(
    rabbitmq: Any, queue_factory: Any
) -> None:
    from typer.testing import CliRunner

    from ackkit.cli import build_cli
    from tests.adversarial.rawamqp import RawClient

    q = queue_factory(declare=True)
    dlq = queue_factory(declare=True)
    with RawClient(rabbitmq.url) as c:
        for i, make in enumerate(HALF_GARBAGE.values()):
            c.publish("", dlq, b"x", {"message_id": f"m{i}", "headers": {"x-death": make(q)}})
    rabbitmq.wait_for(dlq, ready=len(HALF_GARBAGE))
    res = CliRunner().invoke(
        build_cli(), ["dlq", "replay", dlq, "--url", rabbitmq.url], prog_name="ackkit"
    )
    assert res.exit_code == 0, res.output
    assert rabbitmq.counts(q).ready == len(HALF_GARBAGE), res.output
    assert rabbitmq.counts(dlq).ready == 0, res.output
    assert sorted(p.message_id for p, _ in drain(rabbitmq.url, q)) == [
        f"m{i}" for i in range(len(HALF_GARBAGE))
    ]
