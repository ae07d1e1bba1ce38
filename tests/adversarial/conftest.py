"""The adversarial suite: hostile producers, misbehaving handlers and plain misuse.

Every test here runs against a real broker and, where the behaviour belongs to
a listener, on both runtimes (the contract harness's `runtime` fixture: the
pika App and AsyncApp). What a test asserts comes from the broker: queue
counts, what the dead-letter queue holds and its headers, how often a handler
ran. Modules are named for the class of abuse they try.
"""

from __future__ import annotations

import pytest

from tests.contract.conftest import (  # noqa: F401  (fixtures, re-exported for this suite)
    broker,
    loop_thread,
    runtime,
)

# What the App over AMQP 1.0 does not survive yet (issue 35), said once here: RabbitMQ
# 4.3 closes an AMQP 1.0 connection when it cannot convert the message it is about to
# deliver (a decimal header, a timestamp header past 2**63 ms, ...); the consumer
# connects again and the same message closes it again. On a quorum queue its delivery
# limit ends that; on a classic queue it repeats, and the deliveries before it, whose
# dead letters were confirmed but whose acks died with the connection, are
# dead-lettered again each time (seen: 1,003 copies in 30 s). The runtime needs to find
# such a message (credit 1 after such a close) and take it out over AMQP 0-9-1.
NOT_OVER_AMQP10 = {
    "test_unreadable_deliveries_are_dead_lettered_and_the_queue_flows": "a decimal header",
    "test_without_a_dead_letter_queue_the_queues_own_route_takes_it_whole": "its headers",
    "test_generated_hostile_tables_are_dead_lettered": "generated header types",
    "test_every_amqp_type_survives_a_retry_and_a_dead_letter": "a decimal header",
}


@pytest.fixture(autouse=True)
def _not_over_amqp10(request: pytest.FixtureRequest) -> None:
    params = getattr(getattr(request.node, "callspec", None), "params", {})
    name = getattr(request.node, "originalname", request.node.name)
    if params.get("runtime") == "amqp10" and name in NOT_OVER_AMQP10:
        pytest.skip(
            f"AMQP 1.0: RabbitMQ closes the connection on a message it cannot convert "
            f"({NOT_OVER_AMQP10[name]}); not handled yet (tests/adversarial/conftest.py)"
        )


@pytest.fixture
def transport() -> str:
    """The contract harness's transport: this suite runs on real brokers only."""
    return "rabbitmq"
