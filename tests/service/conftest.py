"""Fixtures of the orders service's tests: the same tests on the in-memory broker and,
marked `integration`, on a real RabbitMQ."""

from __future__ import annotations

from typing import Any

import pytest

from ackkit.testing import BrokerHandle


@pytest.fixture(
    params=["memory", pytest.param("rabbitmq", marks=pytest.mark.integration)],
)
def broker(request: pytest.FixtureRequest) -> BrokerHandle:
    """The in-memory broker (fast, no network) or the session's real RabbitMQ."""
    name = "memory_broker" if request.param == "memory" else "rabbitmq"
    handle: BrokerHandle = request.getfixturevalue(name)
    return handle


@pytest.fixture
def queue(broker: BrokerHandle, queue_factory: Any) -> str:
    """A queue name of this test's own (a real broker is shared); it and its dead-letter
    and retry queues are removed afterwards."""
    name: str = queue_factory("orders", broker=broker)
    return name
