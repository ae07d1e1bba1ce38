"""`ackkit dlq inspect` at 80 columns, on a real broker: every line fits, and each dead
letter's reason and error (type and message) read whole, as the failures guide says
(before: every cell was cut, "attempts ex…", and the error message was not shown)."""

from __future__ import annotations

import secrets
import uuid
from typing import Any

import pika
import pytest
from typer.testing import CliRunner

from ackkit import App, Retry
from ackkit.cli import build_cli

pytestmark = pytest.mark.integration


class CardDeclined(Exception):
    pass


def test_dlq_inspect_at_80_columns_shows_reason_and_error(rabbitmq: Any) -> None:
    q = f"pay.{secrets.token_hex(3)}"  # a short name: the title line fits too
    ids = [str(uuid.uuid4()) for _ in range(3)]
    app = App(rabbitmq.url, shutdown_timeout=2)

    @app.listener(q, retry=Retry(max_attempts=1))
    def charge(order: dict[str, Any]) -> None:
        raise CardDeclined(f"card {order['card']} declined")

    try:
        with app.running():
            for mid in ids:
                rabbitmq.publish(q, {"card": 4242}, message_id=mid)
            rabbitmq.wait_for(f"{q}.dlq", ready=3)
        res = CliRunner().invoke(
            build_cli(),
            ["dlq", "inspect", f"{q}.dlq", "--format", "table", "--url", rabbitmq.url],
            env={"COLUMNS": "80"},
            prog_name="ackkit",
        )
        assert res.exit_code == 0, res.output
        lines = res.output.rstrip("\n").split("\n")
        assert all(len(line) <= 80 for line in lines), "\n".join(lines)
        head = lines[1].split()
        assert "reason" in head and "error" in head, lines
        rows = lines[3:6]
        for line in rows:
            assert "attempts exhausted (1 of 1)" in line, lines
            assert "CardDeclined: card 4242 declined" in line, lines
        assert lines[0] == f"{q}.dlq: 3 message(s), all from {q}"
        shown = {r.split()[0].rstrip("…") for r in rows}  # each id, or its start
        assert len(shown) == 3 and all(any(i.startswith(s) for i in ids) for s in shown)
        assert rabbitmq.counts(f"{q}.dlq").ready == 3  # inspect removes nothing
    finally:
        with pika.BlockingConnection(pika.URLParameters(rabbitmq.url)) as conn:
            ch = conn.channel()
            for name in (q, f"{q}.dlq"):
                ch.queue_delete(name)
