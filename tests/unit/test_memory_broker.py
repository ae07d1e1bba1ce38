"""The in-memory broker's rules, checked through its pika-like connection (no network).

Each rule is one RabbitMQ behaviour ackkit's core relies on; the contract suite
(tests/contract, transport "memory") then runs the real runtimes on top.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pika
import pika.exceptions
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ackkit.testing import InMemoryBroker, QueueNotFound
from ackkit.testing._mem_state import topic_matches


@pytest.fixture
def broker() -> Iterator[InMemoryBroker]:
    with InMemoryBroker() as b:
        yield b


def declare(broker: InMemoryBroker, name: str, **args: Any) -> None:
    with broker.connect() as conn:
        conn.channel().queue_declare(name, durable=True, arguments=args or None)


def put(broker: InMemoryBroker, queue: str, *bodies: bytes, **props: Any) -> None:
    with broker.connect() as conn:
        ch = conn.channel()
        for b in bodies:
            ch.basic_publish("", queue, b, pika.BasicProperties(**props))


def test_counts_follow_deliveries_and_acks(broker: InMemoryBroker) -> None:
    declare(broker, "q")
    put(broker, "q", b"a", b"b", b"c")
    assert broker.counts("q").ready == 3
    with broker.connect() as conn:
        ch = conn.channel()
        _, _, body1 = ch.basic_get("q")
        m2, _, _ = ch.basic_get("q")
        assert body1 == b"a"
        c = broker.counts("q")
        assert (c.ready, c.unacked, c.total) == (1, 2, 3)
        ch.basic_ack(m2.delivery_tag)
        assert broker.counts("q").unacked == 1
    # the connection closed with tag 1 unsettled: it is back, first, redelivered
    assert broker.counts("q").ready == 2
    got = broker.messages("q", take=True)
    assert [m.body for m in got] == [b"a", b"c"]
    assert [m.redelivered for m in got] == [True, False]


def test_a_requeued_message_goes_back_to_its_place(broker: InMemoryBroker) -> None:
    declare(broker, "q")
    put(broker, "q", b"1", b"2", b"3")
    with broker.connect() as conn:
        ch = conn.channel()
        tags = [ch.basic_get("q")[0].delivery_tag for _ in range(2)]
        ch.basic_nack(tags[1], requeue=True)
        ch.basic_reject(tags[0], requeue=True)
        order = []
        while True:
            method, _, body = ch.basic_get("q", auto_ack=True)
            if method is None:
                break
            order.append(body)
    assert order == [b"1", b"2", b"3"]


def test_multiple_ack_covers_every_tag_up_to_it(broker: InMemoryBroker) -> None:
    declare(broker, "q")
    put(broker, "q", *[b"x"] * 5)
    with broker.connect() as conn:
        ch = conn.channel()
        tags = [ch.basic_get("q")[0].delivery_tag for _ in range(5)]
        ch.basic_ack(tags[2], multiple=True)
        assert broker.counts("q").unacked == 2
        ch.basic_nack(0, multiple=True, requeue=False)  # no DLX: dropped
    assert broker.counts("q").total == 0


def test_an_unknown_delivery_tag_closes_the_channel_like_rabbitmq(
    broker: InMemoryBroker,
) -> None:
    declare(broker, "q")
    put(broker, "q", b"x")
    with broker.connect() as conn:
        ch = conn.channel()
        method, _, _ = ch.basic_get("q")
        ch.basic_ack(method.delivery_tag)
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
            ch.basic_ack(method.delivery_tag)  # settled twice: a stale tag
        assert err.value.reply_code == 406
        assert "unknown delivery tag" in err.value.reply_text
        assert not ch.is_open


def test_passive_declare_of_a_missing_queue_is_not_found(broker: InMemoryBroker) -> None:
    with broker.connect() as conn, pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
        conn.channel().queue_declare("nope", passive=True)
    assert err.value.reply_code == 404
    with pytest.raises(QueueNotFound):
        broker.counts("nope")


def test_redeclaring_with_other_arguments_is_a_precondition_failure(
    broker: InMemoryBroker,
) -> None:
    declare(broker, "q", **{"x-max-length": 1})
    with broker.connect() as conn:
        conn.channel().queue_declare("q", durable=True, arguments={"x-max-length": 1})  # same
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
            conn.channel().queue_declare("q", durable=True, arguments={"x-max-length": 2})
    assert err.value.reply_code == 406


def test_reject_without_requeue_dead_letters_through_the_dlx_with_x_death(
    broker: InMemoryBroker,
) -> None:
    declare(broker, "dead")
    declare(broker, "q", **{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dead"})
    put(broker, "q", b"poison", headers={"k": "v"})
    with broker.connect() as conn:
        ch = conn.channel()
        method, _, _ = ch.basic_get("q")
        ch.basic_reject(method.delivery_tag, requeue=False)
    (dead,) = broker.messages("dead")
    assert dead.body == b"poison" and dead.headers["k"] == "v"
    (death,) = dead.headers["x-death"]
    assert death["reason"] == "rejected" and death["queue"] == "q" and death["count"] == 1
    assert dead.headers["x-first-death-reason"] == "rejected"


def test_a_ttl_queue_hands_messages_on_when_they_expire() -> None:
    with InMemoryBroker(manual_clock=True) as broker:
        declare(broker, "origin")
        declare(
            broker,
            "delay",
            **{
                "x-message-ttl": 5000,
                "x-dead-letter-exchange": "",
                "x-dead-letter-routing-key": "origin",
            },
        )
        put(broker, "delay", b"later")
        broker.advance(4.9)
        assert broker.counts("delay").ready == 1 and broker.counts("origin").ready == 0
        broker.advance(0.2)
        assert broker.counts("delay").ready == 0
        (back,) = broker.messages("origin")
        assert back.headers["x-death"][0]["reason"] == "expired"


def test_ttl_scale_zero_expires_at_once() -> None:
    with InMemoryBroker(ttl_scale=0) as broker:
        declare(broker, "origin")
        declare(
            broker,
            "delay",
            **{
                "x-message-ttl": 60_000,
                "x-dead-letter-exchange": "",
                "x-dead-letter-routing-key": "origin",
            },
        )
        put(broker, "delay", b"now")
        broker.wait_for("origin", ready=1, timeout=2)


def test_max_length_drops_the_head_or_refuses_the_publish(broker: InMemoryBroker) -> None:
    declare(broker, "head", **{"x-max-length": 2})
    put(broker, "head", b"1", b"2", b"3")
    assert [m.body for m in broker.messages("head")] == [b"2", b"3"]
    declare(broker, "full", **{"x-max-length": 1, "x-overflow": "reject-publish"})
    with broker.connect() as conn:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.basic_publish("", "full", b"1")
        with pytest.raises(pika.exceptions.NackError):
            ch.basic_publish("", "full", b"2")


def test_quorum_queue_counts_deliveries_and_enforces_its_limit(broker: InMemoryBroker) -> None:
    declare(broker, "dead")
    declare(
        broker,
        "qq",
        **{
            "x-queue-type": "quorum",
            "x-delivery-limit": 1,
            "x-dead-letter-exchange": "",
            "x-dead-letter-routing-key": "dead",
        },
    )
    put(broker, "qq", b"x")
    seen = []
    with broker.connect() as conn:
        ch = conn.channel()
        for _ in range(3):
            method, props, _ = ch.basic_get("qq")
            if method is None:
                break
            seen.append((props.headers or {}).get("x-delivery-count"))
            ch.basic_nack(method.delivery_tag, requeue=True)
    assert seen == [None, 1]
    assert broker.dead_letters("dead")[0].dead_letter is not None
    assert broker.messages("dead")[0].headers["x-death"][0]["reason"] == "delivery_limit"


def test_mandatory_publish_nobody_takes_is_returned(broker: InMemoryBroker) -> None:
    with broker.connect() as conn:
        ch = conn.channel()
        ch.confirm_delivery()
        with pytest.raises(pika.exceptions.UnroutableError):
            ch.basic_publish("", "nobody", b"x", mandatory=True)
        ch.basic_publish("", "nobody", b"x")  # not mandatory: dropped quietly


def test_exchanges_route_by_type(broker: InMemoryBroker) -> None:
    for q in ("a", "b", "c"):
        declare(broker, q)
    with broker.connect() as conn:
        ch = conn.channel()
        ch.exchange_declare("orders", "topic", durable=True)
        ch.exchange_declare("fan", "fanout", durable=True)
        ch.queue_bind("a", "orders", "order.*")
        ch.queue_bind("b", "orders", "order.#")
        ch.queue_bind("c", "fan", "")
        ch.basic_publish("orders", "order.created", b"1")
        ch.basic_publish("orders", "order.created.eu", b"2")
        ch.basic_publish("fan", "anything", b"3")
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
            ch.exchange_declare("orders", "direct", durable=True)
        assert err.value.reply_code == 406
    assert [m.body for m in broker.messages("a")] == [b"1"]
    assert [m.body for m in broker.messages("b")] == [b"1", b"2"]
    assert [m.body for m in broker.messages("c")] == [b"3"]


def test_transactions_hold_settles_until_commit(broker: InMemoryBroker) -> None:
    declare(broker, "q")
    put(broker, "q", b"x")
    state = broker.model
    with broker.connect() as conn:
        ch = conn.channel()
        method, _, _ = ch.basic_get("q")
        state.tx_select(ch.state)
        ch.basic_ack(method.delivery_tag)
        assert broker.counts("q").unacked == 1
        state.tx_commit(ch.state)
        assert broker.counts("q").total == 0


def test_force_closed_connections_requeue_their_deliveries(broker: InMemoryBroker) -> None:
    declare(broker, "q")
    put(broker, "q", b"x")
    conn = broker.connect()
    conn.channel().basic_get("q")
    assert broker.counts("q").unacked == 1
    assert broker.close_connections_named("") == 1
    assert broker.counts("q").ready == 1 and not conn.is_open


def test_it_announces_the_rabbitmq_version_it_follows(broker: InMemoryBroker) -> None:
    from ackkit._core.brokers import traits_of

    assert broker.server_version() == "3.13.7"
    with broker.connect() as conn:
        traits = traits_of(conn._impl.server_properties)
    assert traits.series == "3.x" and traits.version == (3, 13, 7)


def test_a_closed_broker_refuses_connections() -> None:
    broker = InMemoryBroker()
    url = broker.url
    broker.close()
    with pytest.raises(pika.exceptions.AMQPConnectionError):
        broker.connect()
    from ackkit import App
    from ackkit._connection.io import FatalConnectError

    app = App(url, startup_timeout=2)
    app.listener("q")(lambda body: None)
    with pytest.raises(FatalConnectError, match="no in-memory broker"):
        app.start()


def test_json_bodies_round_trip_with_headers(broker: InMemoryBroker) -> None:
    declare(broker, "q")
    broker.publish("q", {"id": 1}, headers={"n": 2, "f": 1.5, "s": "t"}, message_id="m1")
    (m,) = broker.messages("q")
    assert m.json() == {"id": 1}
    assert m.properties["content_type"] == "application/json"
    assert m.properties["message_id"] == "m1"
    assert m.headers["n"] == 2 and m.headers["s"] == "t"
    assert json.loads(m.body) == {"id": 1}


SLOW_OK = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
"""No deadline: the machine running the suite may be busy (a deadline would be flaky)."""


@SLOW_OK
@given(st.lists(st.sampled_from(["a", "b", "c"]), min_size=1, max_size=5))
def test_topic_patterns(words: list[str]) -> None:
    key = ".".join(words)
    assert topic_matches(key, key)
    assert topic_matches("#", key)
    assert topic_matches("*", key) == (len(words) == 1)
    assert topic_matches(".".join(["*"] * len(words)), key)
    assert topic_matches(f"{words[0]}.#", key)
    assert not topic_matches(key + ".z", key)


def test_a_publish_as_another_user_is_refused_like_rabbitmq(broker: InMemoryBroker) -> None:
    declare(broker, "q")
    put(broker, "q", b"mine", user_id="guest")
    with broker.connect() as conn:
        ch = conn.channel()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
            ch.basic_publish("", "q", b"x", pika.BasicProperties(user_id="someone-else"))
    assert err.value.reply_code == 406 and "user_id" in err.value.reply_text
    assert broker.counts("q").ready == 1


def test_attach_runs_an_app_built_for_production_on_the_broker(broker: InMemoryBroker) -> None:
    from ackkit import App

    app = App("amqp://svc:secret@rabbit.prod.example:5672/%2f", shutdown_timeout=2)
    seen: list[Any] = []

    @app.listener("orders")
    def on_order(order: dict[str, Any]) -> None:
        seen.append(order)

    with broker.attach(app), app.running():
        broker.publish("orders", {"id": 1})
        broker.wait_for("orders", ready=0, unacked=0)
        with pytest.raises(RuntimeError, match="before starting"), broker.attach(app):
            pass
    assert seen == [{"id": 1}]
    assert app.url == "amqp://svc:secret@rabbit.prod.example:5672/%2f"  # given back


OPS = st.lists(
    st.one_of(
        st.tuples(st.just("publish"), st.integers(1, 3)),
        st.tuples(st.just("get"), st.integers(0, 1)),
        st.tuples(
            st.sampled_from(["ack", "nack", "reject"]),
            st.integers(0, 1),  # which channel
            st.integers(0, 5),  # which of its unsettled deliveries
            st.booleans(),  # requeue
            st.booleans(),  # multiple
        ),
        st.tuples(st.just("close"), st.integers(0, 1)),
    ),
    max_size=40,
)


@SLOW_OK
@given(OPS)
def test_no_message_is_lost_or_duplicated_whatever_the_settles(ops: list[Any]) -> None:
    """Whatever a client does (publish, get, ack / nack / reject with requeue and multiple,
    closing channels), every message is exactly once either ready, unacked, acked, or in
    the dead-letter queue, and the ready ones stay in publish order."""
    with InMemoryBroker(manual_clock=True) as broker:
        declare(broker, "dead")
        declare(broker, "q", **{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dead"})
        conn = broker.connect()
        chans = [conn.channel(), conn.channel()]
        held: list[list[tuple[int, bytes]]] = [[], []]
        published = acked = 0
        for op in ops:
            kind = op[0]
            if kind == "publish":
                for _ in range(op[1]):
                    chans[0].basic_publish("", "q", str(published).encode())
                    published += 1
                continue
            i = op[1]
            if not chans[i].is_open:
                chans[i], held[i] = conn.channel(), []
            ch = chans[i]
            if kind == "get":
                method, _, body = ch.basic_get("q")
                if method is not None:
                    held[i].append((method.delivery_tag, body))
            elif kind == "close":
                ch.close()
                chans[i], held[i] = conn.channel(), []
            elif held[i]:
                _, _, pick, requeue, multiple = op
                tag, _body = held[i][min(pick, len(held[i]) - 1)]
                covered = [h for h in held[i] if h[0] <= tag] if multiple else [(tag, _body)]
                if kind == "ack":
                    ch.basic_ack(tag, multiple=multiple)
                    acked += len(covered)
                elif kind == "nack":
                    ch.basic_nack(tag, multiple=multiple, requeue=requeue)
                else:
                    ch.basic_reject(tag, requeue=requeue)
                    covered = [(tag, _body)]
                held[i] = [h for h in held[i] if h not in covered]
        c, dead = broker.counts("q"), broker.counts("dead")
        assert c.unacked == len(held[0]) + len(held[1])
        assert c.ready + c.unacked + dead.total + acked == published
        conn.close()
        ready = [int(m.body) for m in broker.messages("q", take=True)]
        assert ready == sorted(ready)
        assert len(set(ready)) == len(ready)
        assert broker.counts("q").total == 0


def test_a_per_message_expiration_dead_letters_it_at_the_head() -> None:
    with InMemoryBroker(manual_clock=True) as broker:
        declare(broker, "dead")
        declare(broker, "q", **{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dead"})
        put(broker, "q", b"short", expiration="1000")
        put(broker, "q", b"long", expiration="60000")
        broker.advance(2)
        assert [m.body for m in broker.messages("q")] == [b"long"]
        (dead,) = broker.messages("dead")
        assert dead.body == b"short" and "expiration" not in dead.properties
        assert dead.headers["x-death"][0]["original-expiration"] == "1000"
