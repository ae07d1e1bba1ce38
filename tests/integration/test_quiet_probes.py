"""ackkit asks whether a queue exists with a passive declare; on a missing queue pika logs
the broker's NOT_FOUND close as a WARNING. That answer is expected, so it is left out
of the log; every other channel close is still logged."""

from __future__ import annotations

import logging
from typing import Any

import pika.exceptions
import pytest

from ackkit import App
from ackkit.cli._queues import _amqp as queue_rows
from ackkit.testing import BrokerHandle

pytestmark = pytest.mark.integration


def not_found_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno >= logging.WARNING and "NOT_FOUND" in r.getMessage()
    ]


def test_starting_on_a_queue_that_does_not_exist_yet_logs_no_warning(
    rabbitmq: BrokerHandle, fresh_queue: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    app = App(rabbitmq.url)
    app.listener(fresh_queue)(lambda body: None)
    with app.running():
        rabbitmq.wait_for(fresh_queue, consumers=1)  # it was probed, then declared
    assert not_found_warnings(caplog) == []
    assert any("does not exist (yet)" in r.getMessage() for r in caplog.records)


def test_queues_table_of_a_missing_queue_logs_no_warning(
    rabbitmq: BrokerHandle, fresh_queue: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    _node, rows = queue_rows([rabbitmq.url], [fresh_queue])
    (row,) = rows
    assert row.ready is None
    assert not_found_warnings(caplog) == []


def test_any_other_not_found_is_still_logged(
    rabbitmq: BrokerHandle, fresh_queue: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    conn: Any = rabbitmq.connect()
    try:
        with pytest.raises(pika.exceptions.ChannelClosedByBroker):
            conn.channel().basic_consume(fresh_queue, lambda *a: None)
    finally:
        conn.close()
    assert len(not_found_warnings(caplog)) == 1
