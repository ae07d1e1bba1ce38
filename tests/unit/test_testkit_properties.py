"""The test kit's messages read their properties as a handler reads its delivery's:
``m.properties.reply_to`` works on both (the helpers' properties were a plain dict,
``delivery.properties`` an object), and the dict access of before still works."""

from __future__ import annotations

from typing import Any

import pytest

from ackkit import App, Delivery
from ackkit.testing import InMemoryBroker


def test_helpers_and_handlers_read_properties_alike() -> None:
    with InMemoryBroker() as broker:
        app = App(broker.url, shutdown_timeout=2)
        seen: list[Any] = []

        @app.listener("rpc")
        def handle(msg: Delivery) -> None:
            p = msg.properties
            # the producer's headers (a peeked message comes back redelivered, which
            # ackkit may restamp with headers of its own: see "Attempts")
            mine = {k: v for k, v in (p.headers or {}).items() if not k.startswith("ackkit-")}
            seen.append((p.reply_to, p.correlation_id, p.priority, mine))

        with broker.connect() as conn:
            conn.channel().queue_declare("rpc", durable=True)
        broker.publish(
            "rpc", {"q": 1}, reply_to="answers", correlation_id="c-1", headers={"h": "v"}
        )
        (m,) = broker.messages("rpc")
        p = m.properties
        in_queue = (p.reply_to, p.correlation_id, p.priority, p.headers)
        with app.running():
            broker.wait_for("rpc", ready=0, unacked=0)
    assert seen == [in_queue] == [("answers", "c-1", None, {"h": "v"})]
    assert m.properties["reply_to"] == "answers"  # still a dict of what was set
    assert "priority" not in m.properties
    with pytest.raises(AttributeError, match="no AMQP property 'reply'"):
        _ = m.properties.reply
