"""listener(bind=...) values and the exchange plan, without a broker."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ackkit import App, Queue
from ackkit._core.exchanges import binds, plan
from ackkit.errors import TopologyConflict
from ackkit.topology import Bind, Exchange, ExchangeType

names = st.text(st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=12)
keys = st.text(st.sampled_from("ab.*#"), max_size=8)
exchanges = st.builds(
    Exchange,
    names.filter(lambda n: not n.startswith("amq.")),
    st.sampled_from(list(ExchangeType)),
    st.booleans(),
    st.booleans(),
)


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["q1", "q2", "q3"]),
            st.lists(st.tuples(st.one_of(names, exchanges), keys), max_size=4),
        ),
        max_size=5,
    )
)
def test_the_plan_declares_each_exchange_once_and_each_binding_once(
    listeners: list[tuple[str, list[tuple[Any, str]]]],
) -> None:
    try:
        p = plan((q, binds(bs)) for q, bs in listeners)
    except TopologyConflict:
        explicit: dict[str, list[Exchange]] = {}
        for _, bs in listeners:
            for e, _k in bs:
                if isinstance(e, Exchange) and e not in explicit.setdefault(e.name, []):
                    explicit[e.name].append(e)
        assert any(len(v) > 1 for v in explicit.values())  # only then
        return
    decl_names = [d.exchange.name for d in p.exchanges]
    assert len(decl_names) == len(set(decl_names))
    wanted = {(q, e if isinstance(e, str) else e.name, k) for q, bs in listeners for e, k in bs}
    assert {(b.queue, b.exchange, b.routing_key) for b in p.bindings} == wanted
    assert len(p.bindings) == len(wanted)
    assert set(decl_names) == {x for _, x, _ in wanted}
    for d in p.exchanges:
        assert d.check_first == (d.exchange == Exchange(d.exchange.name)) or not d.check_first


@pytest.mark.parametrize(
    ("option", "expected"),
    [
        (None, ()),
        ("ex", (Bind("ex"),)),
        (("ex", "k"), (Bind("ex", "k"),)),
        ([("ex", "k"), ("ex", "k")], (Bind("ex", "k"),)),
        ([("a", "1"), "b"], (Bind("a", "1"), Bind("b"))),
        (Bind("ex", "k", {"x-match": "all"}), (Bind("ex", "k", {"x-match": "all"}),)),
    ],
)
def test_the_forms_bind_takes(option: Any, expected: tuple[Bind, ...]) -> None:
    assert binds(option) == expected


@pytest.mark.parametrize(
    ("option", "err"),
    [
        ([("", "k")], ValueError),
        ([3], TypeError),
        ([("ex", 3)], TypeError),
        ([("ex", "k" * 256)], ValueError),
        ([("ex", "k", "extra")], TypeError),
    ],
)
def test_bad_bind_options_fail_at_the_decorator(option: Any, err: type[Exception]) -> None:
    app = App("amqp://guest:guest@127.0.0.1:5672/%2f")
    with pytest.raises(err):

        @app.listener(Queue("t.q", bind=option))
        def h(body: bytes) -> None: ...

    assert app.specs == []


def test_bad_exchange_options_fail_at_once() -> None:
    with pytest.raises(ValueError):
        Exchange("x", "bogus")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        Exchange("x", durable="yes")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        Exchange("")
    with pytest.raises(TypeError):
        Bind("ex", "k", {"a": object()})
    assert Exchange("x", "fanout").type is ExchangeType.FANOUT  # type: ignore[arg-type]
    assert Exchange("amq.topic").passive and Exchange("x", declare=False).passive


def test_app_declare_adds_exchanges_and_queues_no_listener_consumes_to_the_plan() -> None:
    from ackkit._core.exchanges import BindingDecl, DeclareQueue, ExchangeDecl, MustExist

    app = App("amqp://guest:guest@127.0.0.1:5672/%2f")

    @app.listener(Queue("t.work", bind=("t.events", "work.#")))
    def work(body: bytes) -> None: ...

    audit = Exchange("t.audit", ExchangeType.FANOUT)
    app.declare(
        audit,
        Queue("t.outbox-target", bind=("t.events", "order.*")),
        Queue("t.audit.log", arguments={"x-max-length": 10}, bind=audit),
        Queue("t.legacy", declare=False),
    )
    p = app._plan()
    assert p.exchanges == (ExchangeDecl(audit), ExchangeDecl(Exchange("t.events"), True))
    assert p.bindings == (
        BindingDecl("t.work", "t.events", "work.#", {}),
        BindingDecl("t.outbox-target", "t.events", "order.*", {}),
        BindingDecl("t.audit.log", "t.audit", "", {}),
    )
    assert p.queues == (
        DeclareQueue("t.outbox-target", {}, "declared queue", unless_exists=True),
        DeclareQueue("t.audit.log", {"x-max-length": 10}, "declared queue"),
        MustExist("t.legacy"),
    )


def test_app_declare_refuses_an_exchange_declared_two_ways_and_other_values_at_once() -> None:
    app = App("amqp://guest:guest@127.0.0.1:5672/%2f")

    @app.listener(Queue("t.a", bind=Bind(Exchange("t.e", ExchangeType.TOPIC), "x")))
    def a(body: bytes) -> None: ...

    with pytest.raises(TopologyConflict, match="declared two ways"):
        app.declare(Exchange("t.e", ExchangeType.FANOUT))
    with pytest.raises(TypeError, match="declare\\(\\) takes Exchange and Queue"):
        app.declare("t.e")  # type: ignore[arg-type]
    app.declare(Exchange("t.e", ExchangeType.TOPIC))  # the same way: fine
    with pytest.raises(TopologyConflict, match="declared two ways"):

        @app.listener(Queue("t.b", bind=Bind(Exchange("t.e", ExchangeType.DIRECT))))
        def b(body: bytes) -> None: ...

    assert app._plan().exchanges[0].exchange == Exchange("t.e", ExchangeType.TOPIC)


def test_app_declare_refuses_a_queue_declared_two_ways_or_a_listeners_queue() -> None:
    app = App("amqp://guest:guest@127.0.0.1:5672/%2f")

    @app.listener("t.work")
    def work(body: bytes) -> None: ...

    with pytest.raises(TopologyConflict, match=r"'t.work' is a listener's queue"):
        app.declare(Queue("t.work", bind=("t.events", "k")))
    app.declare(Queue("t.audit", bind=("t.events", "a")))
    app.declare(Queue("t.audit", bind=("t.events", "b")))  # one more binding: fine
    with pytest.raises(TopologyConflict, match=r"'t.audit' is declared two ways"):
        app.declare(Queue("t.audit", arguments={"x-max-length": 5}))
    with pytest.raises(TopologyConflict, match=r"'t.audit' is a listener's queue"):

        @app.listener("t.audit")
        def audit(body: bytes) -> None: ...

    with pytest.raises(ValueError, match="reserved"):
        Queue("amq.audit")  # a bad name: at the line that builds it
    assert [q.name for q in app._plan().queues] == ["t.audit"]
    assert {(b.queue, b.routing_key) for b in app._plan().bindings} >= {
        ("t.audit", "a"),
        ("t.audit", "b"),
    }
