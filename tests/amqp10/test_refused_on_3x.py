"""RabbitMQ 3.x serves no native AMQP 1.0: an App with protocol="amqp1.0" fails at start
with an error that names the version, at once, without retrying (the 3.10 leg)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from ackkit import App
from ackkit._connection.io import FatalConnectError


def test_an_amqp10_app_on_3x_fails_at_start_naming_the_version(
    rabbitmq: Any, queue_factory: Any
) -> None:
    version = rabbitmq.server_version()
    if int(version.split(".")[0]) >= 4:
        pytest.skip(f"RabbitMQ {version} serves AMQP 1.0")
    app = App(rabbitmq.url, protocol="amqp1.0", startup_timeout=60)

    @app.listener(queue_factory("refused"))
    def handle(body: bytes) -> None:
        raise AssertionError("never called")

    t0 = time.monotonic()
    with pytest.raises(FatalConnectError) as e:
        app.start()
    assert time.monotonic() - t0 < 15  # no reconnect loop until the start-up timeout
    text = str(e.value)
    assert "needs RabbitMQ 4.0 or later" in text and f"RabbitMQ {version}" in text
    assert "guest:guest" not in text  # the password masked
    assert not app.is_running
