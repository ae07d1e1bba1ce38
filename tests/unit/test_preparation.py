"""What a runtime declares before it consumes or publishes, and in which order
(`ackkit._core.exchanges.preparation`): one plan carried out by both runtimes."""

from __future__ import annotations

from ackkit._core.exchanges import (
    BindingDecl,
    DeclareQueue,
    Exchange,
    ExchangeDecl,
    MustExist,
    Plan,
    preparation,
    queue_conflict,
)
from ackkit._core.topology import QueueSpec


def test_checks_come_first_then_exchanges_queues_and_bindings_last() -> None:
    ex = ExchangeDecl(Exchange("shop"))
    bind = BindingDecl("orders", "shop", "order.*", {})
    steps = preparation(
        [QueueSpec("orders.dlq", {"x-queue-type": "quorum"}, "dead-letter queue")],
        [("orders", {}), ("audit", {"x-max-length": 10})],
        ["legacy"],
        Plan((ex,), (bind,)),
    )
    assert steps == [
        MustExist("legacy"),
        ex,
        DeclareQueue("orders", {}, "listener queue", unless_exists=True),
        DeclareQueue("audit", {"x-max-length": 10}, "listener queue"),
        DeclareQueue("orders.dlq", {"x-queue-type": "quorum"}, "dead-letter queue"),
        bind,
    ]


def test_a_queue_with_other_arguments_is_named_with_what_it_is() -> None:
    step = DeclareQueue("orders.dlq", {"x-queue-type": "quorum"}, "dead-letter queue")
    text = str(queue_conflict(step, "PRECONDITION_FAILED - inequivalent arg"))
    assert text.startswith("dead-letter queue 'orders.dlq' already exists")
    assert "inequivalent arg" in text and "x-queue-type" in text


def test_queues_no_listener_consumes_are_checked_first_and_declared_after_the_listeners() -> None:
    check = MustExist("legacy.target")
    audit = DeclareQueue("audit", {}, "declared queue", unless_exists=True)
    steps = preparation([], [("orders", {})], [], Plan((), (), (check, audit)))
    assert steps == [
        check,
        DeclareQueue("orders", {}, "listener queue", unless_exists=True),
        audit,
    ]
