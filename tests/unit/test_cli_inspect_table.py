"""`ackkit dlq inspect` reads at 80 columns: the reason and the error (type and message)
whole, a message-id or notes column that is empty in every row left out, the origin queue
named once when every row shares it (the table cut every cell: "attempts ex…", "original
q…", "2026-11-26…", and had no error message)."""

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
    assert lines[0] == "orders.dlq: 3 message(s), all from orders"
    assert lines[1].split() == ["reason", "error"]
    assert lines[-1] == "(left out to fit: attempts, dead-lettered; --format json has all)"
    row = lines[3]
    assert "attempts exhausted (1 of 1)" in row and "ValueError: order " in row
    assert row.rstrip().endswith(": negative amount") or "negative amount" in row
    assert "…" not in "\n".join(lines)


@pytest.mark.parametrize("message_id", ["m-17", "0123456789abcdef0123456789abcdef"])
def test_with_message_ids_the_table_fits(message_id: str) -> None:
    lines = inspect_at_80(message_id)
    assert all(len(line) <= 80 for line in lines), lines
    assert lines[1].startswith("message_id")
    assert lines[3].startswith(message_id[:10])
    assert "attempts exhausted (1 of 1)" in lines[3] and "negative amount" in lines[3]


def test_what_gives_way_first() -> None:
    """The error type's module, then the message id's end, then the columns of LEFT_OUT."""
    from ackkit.cli._output import dead_letter_table

    row = ["m-1", 5, "payments.errors.CardDeclined", "attempts exhausted (5 of 5)", "q"]
    row += ["2026-11-26T06:49:03.123+00:00", None, "card 4242 declined"]
    wide = dead_letter_table([row], 200)
    assert wide.cells == [
        ["m-1", 5, "attempts exhausted (5 of 5)", wide.cells[0][3], "11-26 06:49:03"]
    ]
    assert wide.cells[0][3] == "payments.errors.CardDeclined: card 4242 declined"
    assert wide.left_out == () and wide.queue == "q"
    narrow = dead_letter_table([row], 80)
    assert narrow.left_out == ("attempts", "dead-lettered")
    assert narrow.cells == [
        ["m-1", "attempts exhausted (5 of 5)", "CardDeclined: card 4242 declined"]
    ]
    assert all(len(x) <= 80 for x in narrow.render(80).splitlines())
