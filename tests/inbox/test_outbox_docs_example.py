"""The outbox example of docs/guide/exactly-once.md ("Declaring what the outbox sends
to"), run as the page shows it on a real RabbitMQ and PostgreSQL (only its URL, DSN and
names made unique): the app declares the `billing` exchange and the `invoices` queue
no listener of it consumes, the handler's row is written once, and the invoice its
outbox sends lands in `invoices`."""

from __future__ import annotations

import contextlib
import uuid
from typing import Any

import psycopg
import pytest
from pydantic import BaseModel

from ackkit.testing import BrokerHandle
from tests.docs._blocks import DOCS, blocks

from ._harness import eventually

pytestmark = pytest.mark.integration


class Order(BaseModel):
    id: int


def test_the_docs_outbox_example_declares_its_target_and_the_invoice_arrives(
    rabbitmq: BrokerHandle, queue_factory: Any, postgres_dsn: str
) -> None:
    (block,) = [b for b in blocks(DOCS / "guide" / "exactly-once.md") if "app.declare(" in b.code]
    orders, invoices = queue_factory("orders"), queue_factory("invoices")
    billing = f"t.ex.billing.{uuid.uuid4().hex[:8]}"
    code = block.code
    for shown, real in [
        ('"amqp://guest:guest@localhost/"', repr(rabbitmq.url)),
        ('"postgresql://app:secret@db/shop"', repr(postgres_dsn)),
        ('"billing"', repr(billing)),
        ('"invoices"', repr(invoices)),
        ('"orders"', repr(orders)),
    ]:
        assert shown in code, shown
        code = code.replace(shown, real)
    with psycopg.connect(postgres_dsn, autocommit=True) as db:
        db.execute("CREATE TABLE shipments (order_id int)")
    ns: dict[str, Any] = {"__name__": "docs_outbox_example", "Order": Order}
    exec(compile(code, block.where, "exec"), ns)
    app = ns["app"]
    try:
        with app.running():
            app.publish(orders, {"id": 7}, message_id="order-7")
            app.publish(orders, {"id": 7}, message_id="order-7")  # sent twice
            eventually(lambda: rabbitmq.counts(invoices).ready == 1, 30, "the invoice")
            eventually(lambda: rabbitmq.counts(orders).total == 0, 30, "orders settled")
        got = rabbitmq.messages(invoices, take=True)
        assert [m.json() for m in got] == [{"order": 7}]
        with psycopg.connect(postgres_dsn) as db:
            assert db.execute("SELECT order_id FROM shipments").fetchall() == [(7,)]
    finally:
        conn = rabbitmq.connect()
        with contextlib.suppress(Exception):
            conn.channel().exchange_delete(billing)
        conn.close()
