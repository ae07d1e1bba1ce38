"""Consumer timeouts per RabbitMQ version: 4.3 cancels the consumer (the Spark source
here; App and AsyncApp in tests/contract/test_broker_versions.py), 3.x closes the
channel (a node of the kit's own, whose consumer_timeout the test may change)."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import pika
import pytest
from _retry_support import wait_until

from ackkit import App, Consumer, Delivery
from ackkit._core.brokers import traits_of
from ackkit._core.events import Stage


def _traits(broker: Any) -> Any:
    conn = broker.connect()
    try:
        return traits_of(conn._impl.server_properties)
    finally:
        conn.close()


def test_spark_source_consumes_again_after_a_43_consumer_timeout(
    rabbitmq: Any, tmp_path: Path
) -> None:
    """The batch taken before the timeout is fenced: writing it acks nothing (the broker
    returned its messages); their redeliveries are settled as copies of a written batch,
    and the source goes on consuming."""
    if not _traits(rabbitmq).timeout_cancels_consumer:
        pytest.skip("a consumer timeout closes the channel before RabbitMQ 4.3")
    pytest.importorskip("pyspark")
    from ackkit.spark import SourceOptions
    from ackkit.spark._consumer import SourceConsumer

    q = f"t.spark-timeout.{uuid.uuid4().hex[:6]}"
    conn = rabbitmq.connect()
    ch = conn.channel()
    ch.queue_declare(
        q, durable=True, arguments={"x-queue-type": "quorum", "x-consumer-timeout": 1000}
    )
    opts = SourceOptions.parse(
        {"url": rabbitmq.url, "queue": q, "checkpoint": str(tmp_path), "declare": "false"}
    )
    c = SourceConsumer(opts, None)
    c.start()
    try:
        assert c.wait_ready(30)
        for i in range(3):
            ch.basic_publish("", q, b"{}", pika.BasicProperties(message_id=f"m{i}"))
        plan = c.take(0, lambda rows, plan: None)
        assert len(plan.rows) == 3
        cancelled = c.core.counters.counts
        assert wait_until(lambda: cancelled[Stage.CONSUMER_CANCELLED] == 1, timeout=30)
        w = c.written(plan.end)
        # Nothing of the fenced batch is acked: stale while the old channel is closing,
        # already dropped once it closed (the timing of a loaded machine decides which).
        assert w["acked"] == 0 and w["stale"] in (0, 3)
        again = c.take(plan.end, lambda rows, plan: None)
        deadline = time.monotonic() + 30
        while len(again.rows) + len(again.admissions) == 0 and time.monotonic() < deadline:
            again = c.take(plan.end, lambda rows, plan: None)
        assert again.rows == []  # the written batch's messages are not rows twice
        rabbitmq.wait_for(q, ready=0, unacked=0, consumers=1, timeout=30)
    finally:
        c.stop()
        rabbitmq.delete_many([q, f"{q}.dlq"])
        conn.close()


def test_a_3x_consumer_timeout_closes_the_channel_and_app_consumes_again(
    own_rabbitmq: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """RabbitMQ before 4.3 closes the channel on a consumer timeout (PRECONDITION_FAILED):
    the old deliveries are fenced as a closed channel's, the app consumes again (run on
    a 3.10 node, and on 4.0 with ACKKIT_TEST_RABBITMQ=4.0)."""
    broker = own_rabbitmq
    if _traits(broker).timeout_cancels_consumer:
        pytest.skip("RabbitMQ 4.3+ cancels the consumer instead")
    broker.eval_erlang(
        "application:set_env(rabbit, consumer_timeout, 1000), "
        "application:set_env(rabbit, channel_tick_interval, 500)."
    )
    q = f"t.timeout-3x.{uuid.uuid4().hex[:6]}"
    calls: list[float] = []
    app = App(broker.url, shutdown_timeout=10.0)

    @app.listener(q, consumer=Consumer(concurrency=2))
    def slow_once(d: Delivery) -> None:
        calls.append(time.monotonic())
        if len(calls) == 1:
            time.sleep(4.0)

    try:
        with app.running():
            conn = broker.connect()
            conn.channel().basic_publish("", q, b"{}")
            conn.close()
            assert wait_until(lambda: len(calls) >= 2, timeout=30)
            broker.wait_for(q, ready=0, unacked=0, consumers=1, timeout=30)
            time.sleep(4.0)  # the slow run ends: its ack is dropped, not sent
            broker.wait_for(q, ready=0, unacked=0, consumers=1)
            (stats,) = app.stats().values()
    finally:
        broker.eval_erlang(
            "application:set_env(rabbit, consumer_timeout, 1800000), "
            "application:set_env(rabbit, channel_tick_interval, 60000)."
        )
        broker.delete_many([q, f"{q}.dlq"])
    assert stats["consumer_cancelled"] == 0  # before 4.3: no basic.cancel
    assert stats["dropped_stale"] == 1 and stats["acked"] == 1
    assert "channel closed by broker" in caplog.text
    print(f"consumer timeout 1 s: handled again after {calls[1] - calls[0]:.2f} s")
