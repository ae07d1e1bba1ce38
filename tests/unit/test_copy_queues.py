"""The queues copies go to, without a broker: delay queues of a quorum origin are
quorum queues that dead-letter at least once; a deleted DLQ or delay queue is
declared again when a copy comes back unroutable (not a hot requeue loop)."""

from __future__ import annotations

from ackkit import App, Delivery, Queue, Retry
from ackkit._core.actions import Ack, Reject, Republish
from ackkit._core.listener import ListenerCore
from tests.unit._fakes import RETRY3, core


def test_a_quorum_origin_gets_quorum_delay_queues_that_dead_letter_at_least_once() -> None:
    """A classic delay queue dead-letters at-most-once: the copies waiting in it when the
    broker restarted never reached the quorum origin queue again (lost, chaos run)."""
    app = App("amqp://guest:guest@localhost:1/%2f")

    @app.listener(Queue("q", arguments={"x-queue-type": "quorum"}), retry=RETRY3)
    def handle(d: Delivery) -> None: ...

    policy = app.specs[0].policy
    assert policy.queue_type == "quorum"
    delays = [s for s in ListenerCore(policy).queues.topology() if s.purpose == "retry-delay"]
    assert delays
    for spec in delays:
        assert spec.arguments["x-queue-type"] == "quorum"
        assert spec.arguments["x-dead-letter-strategy"] == "at-least-once"
        assert spec.arguments["x-overflow"] == "reject-publish"
        assert spec.arguments["x-dead-letter-routing-key"] == "q"
    c = ListenerCore(policy)
    assert c.queues.extra_delay_queue(7.5) is not None
    assert c.queues.extra_delay_queue(7.5).arguments["x-queue-type"] == "quorum"  # type: ignore[union-attr]
    classic = [s for s in core(retry=RETRY3).queues.topology() if s.purpose == "retry-delay"]
    assert all("x-queue-type" not in s.arguments for s in classic)  # unchanged


def test_unroutable_dead_letter_declares_the_dlq_and_publishes_again() -> None:
    """The DLQ deleted while the app runs: every copy came back unroutable and the
    original was requeued, so a poison message looped through the handler (~1,000
    invocations a second on a local broker)."""

    c = core()
    t = c.receive(1)
    (first,) = c.finish(t, ValueError("x"))
    assert isinstance(first, Republish) and first.declare is None
    (again,) = c.republished(first.token, False, unroutable=True)
    assert isinstance(again, Republish)
    assert again.token != first.token and again.routing_key == "q.dlq"
    assert again.declare == ("q.dlq", {})
    assert again.set_headers == first.set_headers and again.again_of == first.token
    assert c.republished(again.token, True) == [Ack(1)]  # acked at once after the confirm
    assert c.drain() == []

    t = c.receive(2)
    (first,) = c.finish(t, ValueError("x"))
    (again,) = c.republished(first.token, False, unroutable=True)
    # Declared and still unroutable: give the original back, once.
    assert c.republished(again.token, False, unroutable=True) == [Reject(2, requeue=True)]


def test_unroutable_retry_declares_the_delay_queue_with_its_ttl() -> None:
    c = core(retry=Retry(max_attempts=3, initial_interval=0.2))
    t = c.receive(1)
    (first,) = c.finish(t, ValueError("x"))
    assert isinstance(first, Republish) and first.routing_key == "q.retry.200ms"
    (again,) = c.republished(first.token, False, unroutable=True)
    assert isinstance(again, Republish)
    assert again.declare == (
        "q.retry.200ms",
        {"x-message-ttl": 200, "x-dead-letter-exchange": "", "x-dead-letter-routing-key": "q"},
    )


def test_retry_later_delay_queue_is_declared_again_too() -> None:
    from ackkit import RetryLater

    c = core(retry=Retry(max_attempts=3, initial_interval=0.2))
    t = c.receive(1)
    (first,) = c.finish(t, RetryLater(delay=0.7))
    assert isinstance(first, Republish) and first.declare is not None  # first use declares
    # Declared with this very publish and still unroutable: requeue.
    assert c.republished(first.token, False, unroutable=True) == [Reject(1, requeue=True)]
    t = c.receive(2)
    (second,) = c.finish(t, RetryLater(delay=0.7))
    assert isinstance(second, Republish) and second.declare is None
    (again,) = c.republished(second.token, False, unroutable=True)
    assert isinstance(again, Republish) and again.declare is not None
    assert again.declare[0] == "q.retry.700ms"
    assert again.declare[1]["x-message-ttl"] == 700


def test_refused_but_routable_copy_still_requeues() -> None:
    """A broker nack (e.g. a full DLQ with overflow reject-publish) is not fixed by
    declaring: the original is requeued as before."""

    c = core()
    t = c.receive(1)
    (first,) = c.finish(t, ValueError("x"))
    assert c.republished(first.token, False) == [Reject(1, requeue=True)]
