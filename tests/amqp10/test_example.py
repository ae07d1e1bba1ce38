"""examples/amqp10.py runs on the 4.3 leg, checked on the broker (on 3.x it says why not:
make demo's default broker)."""

from __future__ import annotations

import importlib
from typing import Any

import pytest


def test_the_amqp10_example(broker4: Any) -> None:
    out = importlib.import_module("examples.amqp10").main(broker4)
    assert out["attempts"][2] == [1, 2] and out["attempts"][4] == [1, 2, 3]
    assert all(out["attempts"][n] == [1] for n in (0, 1, 3, 5))
    assert out["table"] == {"example.amqp10": (0, 0), "example.amqp10.dlq": (1, 0)}


def test_the_example_says_why_not_on_3x(rabbitmq: Any) -> None:
    if int(rabbitmq.server_version().split(".")[0]) >= 4:
        pytest.skip("RabbitMQ 4.x runs the example (above)")
    assert importlib.import_module("examples.amqp10").main(rabbitmq) == {
        "skipped": rabbitmq.server_version()
    }
