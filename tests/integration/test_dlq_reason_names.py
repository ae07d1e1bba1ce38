"""A dead letter's reason names the error as its ackkit-error-type does, qualified (the
reason said "non-retryable CardDeclined" next to "tests....CardDeclined"), read back from a
real broker's DLQ."""

from __future__ import annotations

from typing import Any

import pytest

from ackkit import AckMode, App, Retry

pytestmark = [pytest.mark.integration, pytest.mark.one_leg]


class CardDeclined(Exception):
    pass


def test_the_reason_names_the_error_type_qualified(rabbitmq: Any, queue_factory: Any) -> None:
    fatal, no_ack = queue_factory("fatal"), queue_factory("noack")
    app = App(rabbitmq.url, shutdown_timeout=2)

    @app.listener(fatal, retry=Retry(fatal=(CardDeclined,)))
    def pay(payment: dict[str, Any]) -> None:
        raise CardDeclined("card 4242 declined")

    @app.listener(no_ack, ack_mode=AckMode.NONE)
    def audit(payment: dict[str, Any]) -> None:
        raise CardDeclined("card 4242 declined")

    with app.running():
        rabbitmq.publish(fatal, {"card": 4242})
        rabbitmq.publish(no_ack, {"card": 4242})
        rabbitmq.wait_for(f"{fatal}.dlq", ready=1)
        rabbitmq.wait_for(f"{no_ack}.dlq", ready=1)
    kind = f"{__name__}.CardDeclined"
    (dead,) = rabbitmq.dead_letters(f"{fatal}.dlq")
    assert dead.headers["ackkit-error-type"] == kind
    assert dead.headers["ackkit-reason"] == f"non-retryable {kind}"
    (dead,) = rabbitmq.dead_letters(f"{no_ack}.dlq")
    assert dead.headers["ackkit-reason"] == f"handler failed: {kind}: card 4242 declined"
