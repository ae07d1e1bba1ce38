"""Exchanges and bindings declared by listeners, on a real broker.

What the broker shows is read with rabbitmqctl (list_bindings, list_exchanges)
through the test kit's ctl(); messages are published to the exchanges and
counted where they land.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from _apps import Runner
from _retry_support import channel, wait_until

from ackkit import App, AsyncApp, Queue
from ackkit.errors import MessageUnroutable, TopologyConflict
from ackkit.topology import Bind, Exchange, ExchangeType

pytestmark = [pytest.mark.integration, pytest.mark.one_leg]


@pytest.fixture
def exchanges(rabbitmq: Any) -> Iterator[Any]:
    """exchanges() -> a unique exchange name, deleted after the test."""
    made: list[str] = []

    def new(tag: str = "x") -> str:
        made.append(f"t.ex.{tag}.{uuid.uuid4().hex[:8]}")
        return made[-1]

    yield new
    with channel(rabbitmq.url) as ch:
        for name in made:
            with contextlib.suppress(Exception):
                ch.exchange_delete(name)


def bindings(rabbitmq: Any, queue: str) -> set[tuple[str, str]]:
    """(exchange, routing key) of every binding of `queue`, as the broker lists them."""
    result: set[tuple[str, str]] = rabbitmq.bindings(queue)
    return result


def exchange_types(rabbitmq: Any) -> dict[str, str]:
    result: dict[str, str] = rabbitmq.exchange_types()
    return result


def pub(r: Runner, *args: Any, **kw: Any) -> None:
    import asyncio

    if isinstance(r.app, App):
        r.app.publish(*args, **kw)
        return
    assert r.loop is not None
    asyncio.run_coroutine_threadsafe(r.app.publish(*args, **kw), r.loop).result(60)


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_listeners_bind_their_queues_and_messages_arrive_by_routing_key(
    kind: str, rabbitmq: Any, queue_factory: Any, exchanges: Any
) -> None:
    orders, audit = queue_factory("orders"), queue_factory("audit")
    topic, fan = exchanges("topic"), exchanges("fan")
    app: App | AsyncApp = App(rabbitmq.url) if kind == "sync" else AsyncApp(rabbitmq.url)
    seen: list[tuple[str, Any]] = []
    if isinstance(app, App):

        @app.listener(Queue(orders, bind=[(topic, "order.*"), (topic, "refund.#")]))
        def on_order(body: dict[str, Any]) -> None:
            seen.append(("orders", body["n"]))

        @app.listener(Queue(audit, bind=[Bind(Exchange(fan, ExchangeType.FANOUT)), (topic, "#")]))
        def on_audit(body: dict[str, Any]) -> None:
            seen.append(("audit", body["n"]))
    else:

        @app.listener(Queue(orders, bind=[(topic, "order.*"), (topic, "refund.#")]))
        async def aon_order(body: dict[str, Any]) -> None:
            seen.append(("orders", body["n"]))

        @app.listener(Queue(audit, bind=[Bind(Exchange(fan, ExchangeType.FANOUT)), (topic, "#")]))
        async def aon_audit(body: dict[str, Any]) -> None:
            seen.append(("audit", body["n"]))

    r = Runner(app)
    r.start()
    try:
        assert bindings(rabbitmq, orders) == {("", orders), (topic, "order.*"), (topic, "refund.#")}
        assert bindings(rabbitmq, audit) == {("", audit), (fan, ""), (topic, "#")}
        types = exchange_types(rabbitmq)
        assert (types[topic], types[fan]) == ("topic", "fanout")  # a string: declared as topic
        pub(r, "order.created", {"n": 1}, exchange=topic)  # orders + audit
        pub(r, "refund.a.b", {"n": 2}, exchange=topic)  # orders + audit
        pub(r, "invoice.sent", {"n": 3}, exchange=topic)  # audit only
        pub(r, "ignored", {"n": 4}, exchange=fan)  # audit only
        assert wait_until(lambda: len(seen) == 6, 30), seen
        assert wait_until(lambda: rabbitmq.counts(orders).total == 0, 30)
        assert wait_until(lambda: rabbitmq.counts(audit).total == 0, 30)
    finally:
        r.stop()
    assert sorted(seen) == [
        ("audit", 1),
        ("audit", 2),
        ("audit", 3),
        ("audit", 4),
        ("orders", 1),
        ("orders", 2),
    ]


def test_a_restart_binds_once_and_an_exchange_named_by_string_is_used_as_it_is(
    rabbitmq: Any, queue_factory: Any, exchanges: Any
) -> None:
    q = queue_factory("q")
    direct = exchanges("direct")
    with channel(rabbitmq.url) as ch:
        ch.exchange_declare(direct, "direct", durable=True)
    for _ in range(2):
        app = App(rabbitmq.url)

        @app.listener(Queue(q, bind=[(direct, "k"), (direct, "k")]))  # the same binding twice: one
        def handle(body: bytes) -> None: ...

        with app.running():
            pass
    assert exchange_types(rabbitmq)[direct] == "direct"  # used as it was, not redeclared
    assert bindings(rabbitmq, q) == {("", q), (direct, "k")}


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_an_exchange_that_exists_with_another_type_is_a_topology_conflict(
    kind: str, rabbitmq: Any, queue_factory: Any, exchanges: Any
) -> None:
    q = queue_factory("q")
    ex = exchanges("direct")
    with channel(rabbitmq.url) as ch:
        ch.exchange_declare(ex, "direct", durable=True)
    app: App | AsyncApp = App(rabbitmq.url) if kind == "sync" else AsyncApp(rabbitmq.url)

    @app.listener(Queue(q, bind=Bind(Exchange(ex, ExchangeType.TOPIC), "a.*")))
    def handle(body: bytes) -> None: ...

    r = Runner(app)
    with pytest.raises(TopologyConflict, match=f"exchange '{ex}'.*PRECONDITION_FAILED"):
        r.start()
    assert exchange_types(rabbitmq)[ex] == "direct"
    assert bindings(rabbitmq, q) <= {("", q)}  # nothing bound


def test_an_exchange_that_must_exist_and_does_not_is_a_topology_conflict(
    rabbitmq: Any, queue_factory: Any, exchanges: Any
) -> None:
    q = queue_factory("q")
    ex = exchanges("missing")
    app = App(rabbitmq.url)

    @app.listener(Queue(q, bind=Bind(Exchange(ex, declare=False), "k")))
    def handle(body: bytes) -> None: ...

    with pytest.raises(TopologyConflict, match="NOT_FOUND"):
        app.start()
    assert ex not in exchange_types(rabbitmq)


def test_the_reserved_amq_exchanges_are_bound_without_being_declared(
    rabbitmq: Any, queue_factory: Any
) -> None:
    q = queue_factory("q")
    app = App(rabbitmq.url)
    got: list[bytes] = []

    @app.listener(Queue(q, bind=("amq.topic", f"{q}.#")))
    def handle(body: bytes) -> None:
        got.append(body)

    with app.running():
        assert (("amq.topic", f"{q}.#")) in bindings(rabbitmq, q)
        app.publish(f"{q}.x", b"via amq.topic", exchange="amq.topic")
        assert wait_until(lambda: got == [b"via amq.topic"], 30)
        with pytest.raises(MessageUnroutable):
            app.publish("elsewhere", b"x", exchange="amq.topic")


def test_two_listeners_declaring_one_exchange_two_ways_fail_at_registration() -> None:
    app = App("amqp://guest:guest@127.0.0.1:5672/%2f")

    @app.listener(Queue("t.a", bind=Bind(Exchange("t.e", ExchangeType.TOPIC), "x")))
    def a(body: bytes) -> None: ...

    @app.listener(Queue("t.b", bind=("t.e", "y")))  # by name: agrees with any declaration
    def b(body: bytes) -> None: ...

    with pytest.raises(TopologyConflict, match="declared two ways"):

        @app.listener(Queue("t.c", bind=Bind(Exchange("t.e", ExchangeType.FANOUT))))
        def c(body: bytes) -> None: ...

    assert [s.queue for s in app.specs] == ["t.a", "t.b"]
