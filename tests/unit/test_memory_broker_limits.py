"""The in-memory broker's queue limits, dead-letter cycles, TTL 0 and consumers, checked
through its stand-ins (no network). tests/contract/test_broker_fidelity.py runs the same
cases on a real RabbitMQ; these add the generated sequences and the edges."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pika
import pika.exceptions
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ackkit.testing import InMemoryBroker
from ackkit.testing._mem_deaths import is_cycle
from ackkit.testing._mem_state import inequivalent_arg


@pytest.fixture
def broker() -> Iterator[InMemoryBroker]:
    with InMemoryBroker() as b:
        yield b


def declare(broker: InMemoryBroker, name: str, **args: Any) -> None:
    with broker.connect() as conn:
        conn.channel().queue_declare(name, durable=True, arguments=args or None)


OPS = st.lists(
    st.one_of(
        st.tuples(st.just("publish"), st.integers(0, 6)),
        st.tuples(st.just("get"), st.just(0)),
        st.tuples(st.just("ack"), st.integers(0, 5)),
        st.tuples(st.just("requeue"), st.integers(0, 5)),
    ),
    max_size=30,
)


@settings(max_examples=150)
@given(
    ops=OPS,
    length=st.one_of(st.none(), st.integers(0, 4)),
    size=st.one_of(st.none(), st.integers(0, 16)),
    overflow=st.sampled_from(["drop-head", "reject-publish", "reject-publish-dlx"]),
)
def test_limits_count_ready_messages_and_lose_nothing(
    ops: list[tuple[str, int]], length: int | None, size: int | None, overflow: str
) -> None:
    """Whatever the publishes, gets, acks and requeues: a drop-head queue holds at most
    its limits of ready messages and bytes after each step; a reject-publish queue refuses
    exactly the publishes that would take its ready messages over a limit (unacked ones
    never count); and every message published is in exactly one place (ready, unacked,
    acked, dead-lettered, or refused without dlx)."""
    args: dict[str, Any] = {
        "x-overflow": overflow,
        "x-dead-letter-exchange": "",
        "x-dead-letter-routing-key": "dead",
    }
    if length is not None:
        args["x-max-length"] = length
    if size is not None:
        args["x-max-length-bytes"] = size
    with InMemoryBroker() as broker, broker.connect() as conn:
        declare(broker, "dead")
        declare(broker, "q", **args)
        ch = conn.channel()
        ch.confirm_delivery()
        ready: list[bytes] = []  # what the test expects, oldest first
        unacked: list[tuple[int, bytes]] = []
        acked: list[bytes] = []
        refused: list[bytes] = []
        published: list[bytes] = []
        n = 0
        for op, arg in ops:
            if op == "publish":
                n += 1
                body = b"%d:" % n + b"x" * arg
                published.append(body)
                full = (length is not None and len(ready) + 1 > length) or (
                    size is not None and sum(map(len, ready)) + len(body) > size
                )
                try:
                    ch.basic_publish("", "q", body)
                    accepted = True
                except pika.exceptions.NackError:
                    accepted = False
                if overflow == "drop-head":
                    assert accepted
                else:
                    assert accepted == (not full), (ready, body)
                    if not accepted:
                        refused.append(body)
            elif op == "get":
                method, _, body = ch.basic_get("q")
                if method is not None:
                    unacked.append((method.delivery_tag, body))
            elif unacked:
                tag, body = unacked.pop(arg % len(unacked))
                if op == "ack":
                    ch.basic_ack(tag)
                    acked.append(body)
                else:
                    ch.basic_nack(tag, requeue=True)
            ready = [m.body for m in broker.messages("q")]
            c = broker.counts("q")
            assert c.unacked == len(unacked)
            if overflow == "drop-head":
                assert length is None or len(ready) <= length
                assert size is None or sum(map(len, ready)) <= size
        dead = [m.body for m in broker.messages("dead")]
        lost = refused if overflow == "reject-publish" else []
        everywhere = ready + [b for _, b in unacked] + acked + dead + lost
        assert sorted(everywhere) == sorted(published)
        if overflow != "reject-publish-dlx":
            assert not set(refused) & set(dead)
        else:
            assert set(refused) <= set(dead)


def test_a_requeued_message_may_take_a_reject_publish_queue_over_its_limit(
    broker: InMemoryBroker,
) -> None:
    """Only publishes are refused: a requeue into a full reject-publish queue is kept."""
    declare(broker, "q", **{"x-max-length": 1, "x-overflow": "reject-publish"})
    with broker.connect() as conn:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.basic_publish("", "q", b"1")
        method, _, _ = ch.basic_get("q")
        ch.basic_publish("", "q", b"2")
        ch.basic_nack(method.delivery_tag, requeue=True)
    assert [m.body for m in broker.messages("q")] == [b"1", b"2"]


def test_a_cycle_with_a_rejection_in_it_is_no_cycle() -> None:
    """RabbitMQ's rule: a queue already in x-death closes a cycle only when no death on
    the way back to it was a rejection (a consumer's reject is a decision, not a loop)."""
    a_expired = {"queue": "a", "reason": "expired"}
    assert is_cycle("a", [a_expired])
    assert is_cycle("a", [{"queue": "b", "reason": "expired"}, a_expired])
    assert not is_cycle("a", [{"queue": "b", "reason": "rejected"}, a_expired])
    assert not is_cycle("a", [{"queue": "a", "reason": "rejected"}])
    assert not is_cycle("c", [a_expired])


def test_a_retry_loop_through_a_reject_keeps_going(broker: InMemoryBroker) -> None:
    """work -> (reject) -> delay (TTL) -> work: the reject in the cycle keeps it alive,
    as ackkit's delay queues rely on."""
    declare(broker, "work", **{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "delay"})
    declare(
        broker,
        "delay",
        **{"x-message-ttl": 0, "x-dead-letter-exchange": "", "x-dead-letter-routing-key": "work"},
    )
    with broker.connect() as conn:
        ch = conn.channel()
        ch.basic_publish("", "work", b"again")
        for round_ in range(1, 4):
            broker.wait_for("work", ready=1, timeout=2)
            method, props, _ = ch.basic_get("work")
            if round_ > 1:
                counts = {d["queue"]: d["count"] for d in props.headers["x-death"]}
                assert counts == {"work": round_ - 1, "delay": round_ - 1}
            ch.basic_reject(method.delivery_tag, requeue=False)


def test_a_ttl_0_message_behind_others_waits_for_the_head() -> None:
    """TTL 0 delivers only when a consumer takes it at once; otherwise it expires when it
    reaches the head (RabbitMQ expires at the head only)."""
    with InMemoryBroker(manual_clock=True) as broker:
        declare(broker, "dead")
        declare(broker, "q", **{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dead"})
        with broker.connect() as conn:
            ch = conn.channel()
            ch.basic_publish("", "q", b"first")
            ch.basic_publish("", "q", b"zero", pika.BasicProperties(expiration="0"))
            assert broker.counts("q").ready == 2
            _, _, body = ch.basic_get("q", auto_ack=True)
            assert body == b"first"
        assert broker.counts("q").ready == 0
        assert [m.body for m in broker.messages("dead")] == [b"zero"]


@pytest.mark.parametrize(
    ("current", "received", "named"),
    [
        ({"x-custom": 1}, {"x-custom": 2}, None),
        ({"x-custom": 1}, {}, None),
        ({}, {"x-queue-type": "classic"}, None),
        ({"x-max-priority": 5}, {}, "x-max-priority"),
        ({"x-queue-type": "quorum"}, {"x-queue-type": "classic"}, "x-queue-type"),
        (
            {"x-queue-type": "quorum", "x-delivery-limit": 3},
            {"x-queue-type": "quorum"},
            "x-delivery-limit",
        ),
        ({"x-delivery-limit": 3}, {"x-delivery-limit": 4}, None),  # not a classic argument
        ({"x-overflow": "drop-head"}, {"x-overflow": "reject-publish"}, "x-overflow"),
    ],
)
def test_inequivalent_arguments(
    current: dict[str, Any], received: dict[str, Any], named: str | None
) -> None:
    assert inequivalent_arg(current, received) == named


def test_a_policy_applies_to_the_queues_its_pattern_matches(broker: InMemoryBroker) -> None:
    declare(broker, "orders", **{"x-message-ttl": 1000})
    declare(broker, "orders.dlq")
    broker.set_policy("cap", r"^orders$", {"max-length": 2, "message-ttl": 5000})
    broker.set_policy("tight", r"^orders", {"max-length": 1}, priority=-1)
    assert broker.policy_of("orders") == "cap"  # the higher priority
    assert broker.policy_of("orders.dlq") == "tight"
    with broker.model.lock:
        q = broker.model.queues["orders"]
        assert q.arg("x-max-length") == 2
        assert q.arg("x-message-ttl") == 1000  # the lower of argument and policy
    declare(broker, "orders.new")  # declared later: the policy applies to it too
    assert broker.policy_of("orders.new") == "tight"
    broker.clear_policy("tight")
    assert broker.policy_of("orders.dlq") is None
    with pytest.raises(Exception, match="no policy 'tight'"):
        broker.clear_policy("tight")


@pytest.mark.parametrize(
    ("kw", "error"),
    [
        ({"pattern": "("}, "no regular expression"),
        ({"definition": {"x-max-length": 1}}, "a policy says 'max-length'"),
        ({"definition": {}}, "empty definition"),
        ({"apply_to": "exchanges"}, "apply_to must be one of"),
    ],
)
def test_a_bad_policy_is_refused_at_once(
    broker: InMemoryBroker, kw: dict[str, Any], error: str
) -> None:
    args: dict[str, Any] = {"pattern": ".*", "definition": {"max-length": 1}, **kw}
    with pytest.raises(ValueError, match=error):
        broker.set_policy("p", args.pop("pattern"), args.pop("definition"), **args)


class _Sink:
    def __init__(self) -> None:
        self.cancelled_tags: list[str] = []
        self.closed_with: tuple[int, str] | None = None

    def deliver(self, consumer_tag: str, tag: int, msg: Any, redelivered: bool) -> None:
        pass

    def closed(self, code: int, text: str) -> None:
        self.closed_with = (code, text)

    def cancelled(self, consumer_tag: str) -> None:
        self.cancelled_tags.append(consumer_tag)


@settings(max_examples=100)
@given(st.lists(st.tuples(st.sampled_from(["consume", "cancel"]), st.booleans()), max_size=12))
def test_exclusive_consumers_follow_rabbitmqs_rule(steps: list[tuple[str, bool]]) -> None:
    """Any sequence of consumes (exclusive or not) and cancels, each on its own channel:
    a consume is refused (403, its channel closed) exactly when the queue has an
    exclusive consumer, or when it is exclusive and the queue has any consumer. Deleting
    the queue then cancels every consumer it still has, once."""
    from ackkit.testing._mem_state import ChannelError

    with InMemoryBroker() as broker:
        declare(broker, "q")
        model = broker.model
        live: list[tuple[Any, str, bool, _Sink]] = []
        for i, (op, exclusive) in enumerate(steps):
            if op == "cancel":
                if live:
                    ch, tag, _, _ = live.pop(0)
                    model.cancel(ch, tag)
                continue
            sink = _Sink()
            ch = model.open_channel(sink, "t")
            refused = bool(live) and (exclusive or any(e for _, _, e, _ in live))
            try:
                tag = model.consume(ch, "q", False, f"c{i}", exclusive)
            except ChannelError as exc:
                assert refused
                assert exc.code == 403 and "in exclusive use" in exc.text
                assert sink.closed_with is not None and not ch.open
                continue
            assert not refused
            live.append((ch, tag, exclusive, sink))
            assert broker.counts("q").consumers == len(live)
        broker.delete("q")
        for ch, tag, _, sink in live:
            assert sink.cancelled_tags == [tag] and ch.open and tag not in ch.consumers
