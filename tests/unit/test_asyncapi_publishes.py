"""`listener(publishes=[Publication(...)])`: what a handler publishes is in the AsyncAPI
document (`ackkit docs`, `app.asyncapi()`) as send operations with the payload's schema,
on the channel a listener of the same address receives from."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from ackkit import App, Publication
from ackkit.cli import build_cli
from ackkit.topology import Exchange, ExchangeType

from .test_cli_output import check_asyncapi

SERVICE = """
from pydantic import BaseModel
from ackkit import App, Publication, Queue

class Line(BaseModel):
    sku: str

class OrderAccepted(BaseModel):
    id: int
    lines: list[Line]

class Order(BaseModel):
    id: int

app = App("amqp://svc:pw@rabbit.example:5672/shop")

@app.listener(
    "orders",
    publishes=[
        Publication("shop", "order.accepted", OrderAccepted),
        Publication("", "invoices", bytes),
    ],
)
def on_order(order: Order) -> None: ...

@app.listener(Queue("shipping", bind=("shop", "order.accepted")))
def ship(event: dict) -> None: ...
"""


def docs(tmp_path: Path, *args: str) -> Any:
    (tmp_path / "svc_publishes.py").write_text(SERVICE)
    sys.path.insert(0, str(tmp_path))
    try:
        return CliRunner().invoke(build_cli(), ["docs", "svc_publishes:app", *args])
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("svc_publishes", None)


def test_what_a_listener_publishes_is_a_send_operation_with_its_payload_schema(
    tmp_path: Path,
) -> None:
    r = docs(tmp_path)
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    check_asyncapi(doc)
    ops = doc["operations"]
    send = ops["send.orders_on_order.shop.order.accepted"]
    assert send["action"] == "send"
    assert send["channel"] == {"$ref": "#/channels/shop.order.accepted"}
    msg_key = "orders_on_order.sends.shop.order.accepted"
    assert send["messages"] == [{"$ref": f"#/channels/shop.order.accepted/messages/{msg_key}"}]
    # One channel: shipping receives on it what on_order sends.
    ch = doc["channels"]["shop.order.accepted"]
    assert set(ch["messages"]) == {msg_key, "shipping_ship.message"}
    assert ch["bindings"]["amqp"]["exchange"]["name"] == "shop"
    msg = doc["components"]["messages"][msg_key]
    assert msg["contentType"] == "application/json" and msg["title"] == "OrderAccepted"
    assert msg["payload"]["required"] == ["id", "lines"]
    assert msg["payload"]["properties"]["lines"]["items"] == {"$ref": "#/components/schemas/Line"}
    assert doc["components"]["schemas"]["Line"]["properties"]["sku"]["type"] == "string"

    raw = ops["send.orders_on_order.default.invoices"]
    assert raw["channel"] == {"$ref": "#/channels/invoices"}
    assert doc["channels"]["invoices"]["bindings"]["amqp"]["queue"]["name"] == "invoices"
    bytes_msg = doc["components"]["messages"]["orders_on_order.sends.default.invoices"]
    assert bytes_msg["contentType"] == "application/octet-stream"
    assert bytes_msg["payload"] == {"type": "string", "format": "binary"}

    yaml = docs(tmp_path, "--format", "yaml")
    assert yaml.exit_code == 0 and '"send.orders_on_order.shop.order.accepted":' in yaml.output


def test_a_publication_to_an_exchange_value_and_without_payload_type() -> None:
    app = App("amqp://guest:guest@127.0.0.1:5672/%2f")
    fan = Exchange("events", ExchangeType.FANOUT)

    @app.listener("q", publishes=Publication(fan))
    def handle(body: bytes) -> None: ...

    doc = app.asyncapi()
    check_asyncapi(doc)
    ch = doc["channels"]["events._"]
    assert ch["address"] is None
    assert ch["bindings"]["amqp"]["exchange"]["type"] == "fanout"
    assert doc["components"]["messages"]["q_handle.sends.events."]["payload"] == {}
    assert app.specs[0].publishes == (Publication(fan),)


def test_bad_publications_fail_at_the_decorator() -> None:
    app = App("amqp://guest:guest@127.0.0.1:5672/%2f")
    with pytest.raises(ValueError, match="default exchange '' needs the queue"):
        Publication("")
    with pytest.raises(TypeError, match="pydantic cannot describe it"):
        Publication("x", "k", type("Opaque", (), {}))
    with pytest.raises(TypeError, match="publishes= takes Publication values"):
        app.listener("q", publishes=[("x", "k")])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="Publication routing_key"):
        Publication("x", 3)  # type: ignore[arg-type]
