"""`ackkit dlq inspect` reads at 80 columns: the reason is whole when it fits, the time
short (MM-DD HH:MM:SS), and a message-id or notes column that is empty in every row is
left out (the table cut every cell: "attempts ex…", "original q…", "2026-11-26…")."""

from __future__ import annotations

from typing import Any

import pika
import pytest
from typer.testing import CliRunner

from ackkit import App
from ackkit.cli import build_cli
from ackkit.testing import InMemoryBroker


def inspect_at_80(message_id: str | None) -> list[str]:
    with InMemoryBroker(ttl_scale=0) as broker:
        app = App(broker.url, shutdown_timeout=2)

        @app.listener("orders")
        def handle(order: dict[str, Any]) -> None:
            raise ValueError(f"order {order['id']}: negative amount")

        with app.running():
            for i in range(3):
                if message_id:
                    broker.publish("orders", {"id": i}, message_id=message_id)
                else:  # a publisher other than ackkit's fronts, which always set one
                    with broker.connect() as conn:
                        json = pika.BasicProperties(content_type="application/json")
                        conn.channel().basic_publish("", "orders", b'{"id": %d}' % i, json)
            broker.wait_for("orders.dlq", ready=3)
        res = CliRunner().invoke(
            build_cli(),
            ["dlq", "inspect", "orders.dlq", "--format", "table", "--url", broker.url],
            env={"COLUMNS": "80"},
            prog_name="ackkit",
        )
    assert res.exit_code == 0, res.output
    return res.output.rstrip("\n").split("\n")


def test_without_message_ids_every_cell_is_whole() -> None:
    lines = inspect_at_80(None)
    assert all(len(line) <= 80 for line in lines), lines
    assert lines[1].split() == ["attempts", "error", "type", "reason", "queue", "dead-lettered"]
    row = lines[3]
    assert "ValueError" in row and "attempts exhausted (1 of 1)" in row and "orders" in row
    assert "…" not in "\n".join(lines)


@pytest.mark.parametrize("message_id", ["m-17", "0123456789abcdef0123456789abcdef"])
def test_with_message_ids_the_table_fits(message_id: str) -> None:
    lines = inspect_at_80(message_id)
    assert all(len(line) <= 80 for line in lines), lines
    assert lines[1].startswith("message_id")
    assert lines[3].startswith(message_id[:10])
    assert "attempts exhausted" in lines[3]
