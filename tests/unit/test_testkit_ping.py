"""The test kit's liveness probe says "not yet" however a booting node fails to answer.

A node whose port accepts the socket before it finishes booting made pika's
connection workflow raise AMQPConnectorStackTimeout, which is not an AMQPError: the
probe raised instead of answering False, and the node's start failed a test setup
(seen in CI while a RabbitMQ 4.3 node was restarted).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pika
import pytest
from pika.adapters.utils.connection_workflow import AMQPConnectorStackTimeout

from ackkit.testing import _handle


@pytest.mark.parametrize(
    "error",
    [
        AMQPConnectorStackTimeout("Timeout during AMQP handshake"),
        pika.exceptions.AMQPConnectionError("refused"),
        ConnectionResetError("reset"),
    ],
)
def test_ping_is_false_while_the_handshake_fails(monkeypatch: Any, error: Exception) -> None:
    seen: list[Any] = []

    def refuse(params: Any) -> None:
        seen.append(params)
        raise error

    monkeypatch.setattr(_handle, "_amqp_greets", lambda *a, **kw: True)
    monkeypatch.setattr(
        _handle,
        "_pika",
        lambda: SimpleNamespace(
            BlockingConnection=refuse, URLParameters=pika.URLParameters, exceptions=pika.exceptions
        ),
    )
    h = _handle.BrokerHandle(
        "amqp://guest:guest@127.0.0.1:1/%2f", own=False, amqp_port=1, node_name=None
    )
    assert h.ping(timeout=0.1) is False
    assert len(seen) == 1  # it got as far as the handshake
