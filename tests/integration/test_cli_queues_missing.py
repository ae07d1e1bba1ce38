"""`ackkit queues NAME` exits 1 when a queue it was asked for does not exist (it exited
0 with an empty row), on every source; 0 when all of them exist."""

from __future__ import annotations

from typing import Any

import pytest
from typer.testing import CliRunner

from ackkit.cli import build_cli
from ackkit.testing import BrokerHandle, InMemoryBroker


def queues(url: str, *args: str) -> Any:
    return CliRunner().invoke(
        build_cli(), ["queues", *args, "--format", "tsv", "--url", url], prog_name="ackkit"
    )


@pytest.mark.integration
@pytest.mark.parametrize("source", ["auto", "amqp"])
def test_a_missing_queue_exits_1_on_a_real_broker(
    rabbitmq: BrokerHandle, queue_factory: Any, source: str
) -> None:
    there = queue_factory(broker=rabbitmq, declare=True)
    gone = queue_factory(broker=rabbitmq)  # never declared
    ok = queues(rabbitmq.url, there, "--source", source)
    assert ok.exit_code == 0, ok.output
    res = queues(rabbitmq.url, there, gone, "--source", source)
    assert res.exit_code == 1, res.output
    assert f"not found: {gone}" in res.output
    assert there in res.output  # the rows are still printed


def test_a_missing_queue_exits_1_on_the_in_memory_broker() -> None:
    with InMemoryBroker() as broker, broker.connect() as conn:
        conn.channel().queue_declare("orders", durable=True)
        assert queues(broker.url, "orders").exit_code == 0
        res = queues(broker.url, "orders", "nosuchqueue")
        assert res.exit_code == 1, res.output
        assert "not found: nosuchqueue" in res.output
