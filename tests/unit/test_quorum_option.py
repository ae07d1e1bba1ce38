"""Queue(name, quorum=True): what ackkit declares for the listener (no broker)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from ackkit import App, Queue, Retry, RetryStrategy
from ackkit._core.brokers import UNKNOWN, V3, V40, V43, BrokerTraits, traits_for
from ackkit._core.exchanges import DeclareQueue, preparation, queue_conflict
from ackkit._core.policy import ListenerPolicy
from ackkit._core.topology import (
    DLQ_DELIVERY_LIMIT,
    check_broker,
    extra_delay_queue,
    listener_arguments,
    own_queue,
    topology,
)
from ackkit.errors import TopologyConflict

RETRY = Retry(max_attempts=4, initial_interval=0.5, multiplier=2.0, max_interval=2.0)
QUORUM_DELAY = {"x-queue-type": "quorum", "x-dead-letter-strategy": "at-least-once"}


def _spec(queue: Queue | str, retry: Retry = RETRY, **kw: Any) -> Any:
    app = App("amqp://guest:guest@127.0.0.1:5672/%2f")

    @app.listener(queue, retry=retry, **kw)
    def h(body: bytes) -> None: ...

    return app.specs[0]


def _declared(queue: Queue | str, broker: BrokerTraits = V43, **kw: Any) -> dict[str, dict]:
    """Every queue the listener's runtime would declare, by name, with its arguments."""
    spec = _spec(queue, **kw)
    args, _ = listener_arguments(spec.policy, broker, spec.queue_arguments)
    user = [(spec.queue, args)] if spec.declare else []
    steps = preparation(topology(spec.policy), user, [] if spec.declare else [spec.queue])
    return {s.name: s.arguments for s in steps if isinstance(s, DeclareQueue)}


def test_quorum_makes_every_queue_ackkit_declares_a_quorum_queue() -> None:
    declared = _declared(Queue("orders", quorum=True))
    assert sorted(declared) == [
        "orders",
        "orders.dlq",
        "orders.retry.1000ms",
        "orders.retry.2000ms",
        "orders.retry.500ms",
    ]
    assert declared["orders"] == {"x-queue-type": "quorum"}
    assert declared["orders.dlq"] == {
        "x-queue-type": "quorum",
        "x-delivery-limit": DLQ_DELIVERY_LIMIT,
    }
    for ms in (500, 1000, 2000):
        delay = declared[f"orders.retry.{ms}ms"]
        # a queue-level TTL per tier: the copies themselves carry no expiration
        assert delay == {
            **QUORUM_DELAY,
            "x-message-ttl": ms,
            "x-dead-letter-exchange": "",
            "x-dead-letter-routing-key": "orders",
            "x-overflow": "reject-publish",
        }


def test_without_quorum_nothing_changes() -> None:
    declared = _declared("orders")
    assert declared["orders"] == {}
    assert declared["orders.dlq"] == {}
    assert "x-queue-type" not in declared["orders.retry.500ms"]
    # the queue's own arguments saying quorum: delay queues quorum, the DLQ classic as before
    declared = _declared(Queue("orders", arguments={"x-queue-type": "quorum"}))
    assert declared["orders.dlq"] == {}
    assert declared["orders.retry.500ms"]["x-queue-type"] == "quorum"


def test_the_users_arguments_stay_beside_the_type() -> None:
    q = Queue("orders", quorum=True, arguments={"x-delivery-limit": 50, "x-max-length": 9})
    assert q.arguments == {"x-delivery-limit": 50, "x-max-length": 9, "x-queue-type": "quorum"}
    assert q.queue_type == "quorum"
    assert _declared(q)["orders"] == q.arguments


def test_declare_false_declares_only_ackkits_queues_as_quorum() -> None:
    declared = _declared(Queue("orders", declare=False, quorum=True))
    assert "orders" not in declared
    assert declared["orders.dlq"]["x-queue-type"] == "quorum"
    assert declared["orders.retry.500ms"]["x-queue-type"] == "quorum"
    assert _spec(Queue("orders", declare=False, quorum=True)).policy.queue_type == "quorum"


def test_delay_queues_asked_for_later_are_quorum_too() -> None:
    policy = _spec(Queue("orders", quorum=True)).policy
    extra = extra_delay_queue(policy, 7.0)
    assert extra is not None and extra.arguments["x-queue-type"] == "quorum"
    assert extra.arguments["x-message-ttl"] == 7000
    dlq = own_queue(policy, "orders.dlq")
    assert dlq is not None and dlq.arguments["x-queue-type"] == "quorum"


def test_in_process_retry_has_no_delay_queues_and_a_quorum_dlq() -> None:
    r = Retry(max_attempts=3, strategy=RetryStrategy.IN_PROCESS)
    declared = _declared(Queue("orders", quorum=True), retry=r)
    assert sorted(declared) == ["orders", "orders.dlq"]
    assert declared["orders.dlq"]["x-queue-type"] == "quorum"


def test_dead_letter_none_declares_no_dlq() -> None:
    declared = _declared(Queue("orders", quorum=True), dead_letter=None)
    assert "orders.dlq" not in declared


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"arguments": {"x-queue-type": "classic"}}, r"x-queue-type.*'classic'"),
        ({"arguments": {"x-max-priority": 5}}, r"x-max-priority.*quorum queue refuses"),
        ({"arguments": {"x-queue-mode": "lazy"}}, r"x-queue-mode"),
        ({"arguments": {"x-queue-version": 2}}, r"x-queue-version"),
    ],
)
def test_contradictions_fail_where_the_queue_is_written(kw: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Queue("orders", quorum=True, **kw)


def test_quorum_must_be_a_bool() -> None:
    with pytest.raises(TypeError, match=r"Queue\.quorum must be True or False"):
        Queue("orders", quorum="yes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="x-queue-type 'classic'"):
        ListenerPolicy(name="l", queue="orders", quorum=True, queue_type="classic")


@pytest.mark.parametrize("raw", ["3.8.35", "3.9.29"])
def test_quorum_delay_queues_need_310(raw: str) -> None:
    old = traits_for(raw)
    assert not old.quorum_ttl_dead_letter
    policy = _spec(Queue("orders", quorum=True)).policy
    with pytest.raises(TopologyConflict, match=r"'orders:h'.*3\.10 or later.*reports 3\.[89]"):
        check_broker(policy, old)
    in_process = Retry(max_attempts=3, strategy=RetryStrategy.IN_PROCESS)
    check_broker(_spec(Queue("orders", quorum=True), retry=in_process).policy, old)


@pytest.mark.parametrize("traits", [V3, V40, V43, UNKNOWN, traits_for("3.10.8")])
def test_quorum_delay_queues_on_310_and_later(traits: BrokerTraits) -> None:
    assert traits.quorum_ttl_dead_letter
    check_broker(_spec(Queue("orders", quorum=True)).policy, traits)


@pytest.mark.parametrize(
    ("said", "names"),
    [
        (  # 4.3.6
            "PRECONDITION_FAILED - inequivalent arg 'x-queue-type' for queue 'orders.dlq' in "
            "vhost '/': received 'quorum' but current is 'classic'",
            "x-queue-type: the queue has 'classic', ackkit declares 'quorum'",
        ),
        (  # 3.10.8
            "PRECONDITION_FAILED - inequivalent arg 'x-queue-type' for queue 'orders.dlq' in "
            "vhost '/': received the value 'quorum' of type 'longstr' but current is none",
            "x-queue-type: the queue has none set, ackkit declares 'quorum'",
        ),
    ],
)
def test_an_existing_queue_of_another_type_is_named_with_the_mismatch(
    said: str, names: str
) -> None:
    step = DeclareQueue("orders.dlq", {"x-queue-type": "quorum"}, "dead-letter")
    text = str(queue_conflict(step, said))
    assert text.startswith("dead-letter 'orders.dlq' already exists with arguments")
    assert names in text and "type never changes" in text and said in text


def test_a_conflict_the_broker_words_otherwise_keeps_its_words() -> None:
    step = DeclareQueue("orders.dlq", {}, "dead-letter")
    text = str(queue_conflict(step, "PRECONDITION_FAILED - something new"))
    assert "broker said: PRECONDITION_FAILED - something new" in text
    assert "ackkit declares" not in text


@pytest.mark.parametrize("version", ["3.13", "4.0", "4.3"])
def test_retry_and_dead_letter_through_quorum_queues_on_the_memory_broker(version: str) -> None:
    from ackkit.testing import InMemoryBroker

    calls: list[tuple[str, int]] = []
    with InMemoryBroker(rabbitmq=version, ttl_scale=0) as broker:
        app = App(broker.url, shutdown_timeout=2)

        @app.listener(Queue("orders", quorum=True), retry=RETRY)
        def handle(order: dict[str, Any]) -> None:
            calls.append((order["kind"], len(calls)))
            if order["kind"] == "bad" or sum(k == "flaky" for k, _ in calls) == 1:
                raise RuntimeError(order["kind"])

        with app.running():
            broker.publish("orders", {"kind": "flaky"}, message_id="flaky")
            deadline = time.monotonic() + 10
            while [k for k, _ in calls].count("flaky") < 2 and time.monotonic() < deadline:
                time.sleep(0.01)
            broker.publish("orders", {"kind": "bad"}, message_id="bad")
            broker.wait_for("orders.dlq", ready=1)
            broker.wait_for("orders", ready=0, unacked=0)
    kinds = [k for k, _ in calls]
    assert kinds.count("flaky") == 2 and kinds.count("bad") == RETRY.max_attempts
