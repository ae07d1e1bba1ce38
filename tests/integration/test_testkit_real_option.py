"""`--real-broker`: the amqp_broker fixture of a user's suite gives the real RabbitMQ."""

from __future__ import annotations

from typing import Any

import pytest

from ackkit.testing import BrokerHandle

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("how", ["option", "environment"])
def test_real_broker_option_gives_amqp_broker_the_real_rabbitmq(
    rabbitmq: BrokerHandle, tmp_path: Any, how: str
) -> None:
    from tests.unit.test_testkit_helpers import run_user_suite

    # The user's run gets its broker the way this run got `rabbitmq` (the same
    # environment: AMQP_URL, or a node of the kit's own of ACKKIT_TEST_RABBITMQ).
    if how == "option":
        out = run_user_suite(tmp_path, "--real-broker")
    else:
        out = run_user_suite(tmp_path, env={"ACKKIT_TEST_REAL_BROKER": "1"})
    assert "BROKER-KIND memory" not in out and "BROKER-KIND" in out


def test_the_testing_guide_real_broker_example_runs_as_written(
    rabbitmq: BrokerHandle, fresh_queue: str
) -> None:
    from tests.unit.test_readme_testing import section_code

    (code,) = section_code("A real RabbitMQ for your tests")  # docs/guide/testing.md
    scope: dict[str, Any] = {}
    exec(compile(code, "docs/guide/testing.md", "exec"), scope)
    scope["test_orders_are_acked"](rabbitmq, fresh_queue)
