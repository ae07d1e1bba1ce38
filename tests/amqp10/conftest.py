"""The App over AMQP 1.0 against a real RabbitMQ 4.x (the 4.3 leg); on an older broker
these tests skip, but for the one that checks the refusal (`test_refused_on_3x`)."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("proton")


@pytest.fixture
def broker4(rabbitmq: Any) -> Any:
    """The session's broker, when it serves AMQP 1.0 natively (4.0+)."""
    if int(rabbitmq.server_version().split(".")[0]) < 4:
        pytest.skip("AMQP 1.0 needs RabbitMQ 4.0 or later")
    return rabbitmq
