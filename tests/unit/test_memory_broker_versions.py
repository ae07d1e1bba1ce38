"""The in-memory broker's per-version rules (`_mem_rules`), through its pika-like connection.

The expected values are what RabbitMQ 4.3.6 and 3.10.8 showed for the same steps
(tests/contract/RESULTS.md, "Settling and the counts a quorum queue keeps").
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pika
import pika.exceptions
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ackkit._core.brokers import traits_of
from ackkit.testing import InMemoryBroker
from ackkit.testing import plugin as kit_plugin

QUORUM = {"x-queue-type": "quorum"}


@pytest.fixture(params=["3.13", "4.0", "4.3"])
def broker(request: pytest.FixtureRequest) -> Iterator[InMemoryBroker]:
    with InMemoryBroker(rabbitmq=request.param) as b:
        yield b


def declare(broker: InMemoryBroker, name: str, **args: Any) -> None:
    with broker.connect() as conn:
        conn.channel().queue_declare(name, durable=True, arguments=args or None)


def put(broker: InMemoryBroker, queue: str, body: bytes = b"x", **headers: Any) -> None:
    with broker.connect() as conn:
        props = pika.BasicProperties(headers=headers or None)
        conn.channel().basic_publish("", queue, body, props)


def counts_of(headers: dict[str, Any] | None) -> tuple[Any, Any]:
    h = headers or {}
    return h.get("x-delivery-count"), h.get("x-acquired-count")


def test_each_version_is_announced_and_read_by_the_runtimes(broker: InMemoryBroker) -> None:
    want = {"3.13": "3.13.7", "4.0": "4.0.5", "4.3": "4.3.6"}
    series = next(k for k, v in want.items() if v == broker.server_version())
    with broker.connect() as conn:
        traits = traits_of(conn._impl.server_properties)
    assert traits.version is not None and traits.version[:2] == tuple(
        int(p) for p in series.split(".")
    )
    assert repr(broker).endswith(f"(RabbitMQ {broker.server_version()} rules)>")


def test_the_default_is_313_and_unknown_versions_are_refused() -> None:
    with InMemoryBroker() as b:
        assert b.server_version() == "3.13.7"
    with InMemoryBroker(rabbitmq="3.10") as b:
        assert b.server_version() == "3.13.7"
    with InMemoryBroker(rabbitmq="4") as b:
        assert b.server_version() == "4.3.6"
    with pytest.raises(ValueError, match=r"follows RabbitMQ 3\.13, 4\.0, 4\.3"):
        InMemoryBroker(rabbitmq="3.8")


def test_quorum_counts_per_settle_kind_as_the_brokers_showed(broker: InMemoryBroker) -> None:
    """Publisher writes x-delivery-count 7; then reject, nack, channel closed, reject,
    nack(multiple): the headers of each next delivery."""
    declare(broker, "qq", **QUORUM)
    put(broker, "qq", **{"x-delivery-count": 7})
    seen = []
    with broker.connect() as conn:
        ch = conn.channel()
        for step in ("reject", "nack", "close", "reject", "nack-multiple", "ack"):
            method, props, _ = ch.basic_get("qq")
            assert method is not None
            seen.append(counts_of(props.headers))
            if step == "reject":
                ch.basic_reject(method.delivery_tag, requeue=True)
            elif step == "nack":
                ch.basic_nack(method.delivery_tag, requeue=True)
            elif step == "nack-multiple":
                ch.basic_nack(0, multiple=True, requeue=True)
            elif step == "close":
                ch.close()
                ch = conn.channel()
            else:
                ch.basic_ack(method.delivery_tag)
    if broker.server_version().startswith("4.3"):
        assert seen == [(7, None), (1, 1), (1, 2), (2, 3), (3, 4), (3, 5)]
    else:  # 3.10.8 measured; 4.0 counts as 3.x does
        assert seen == [(0, None), (1, None), (2, None), (3, None), (4, None), (5, None)]
    assert broker.counts("qq").total == 0


def test_a_first_delivery_without_a_publishers_count_has_no_count_header(
    broker: InMemoryBroker,
) -> None:
    declare(broker, "qq", **QUORUM)
    put(broker, "qq")
    with broker.connect() as conn:
        method, props, _ = conn.channel().basic_get("qq", auto_ack=True)
    assert method is not None and counts_of(props.headers) == (None, None)


RETURNS = st.lists(st.sampled_from(["reject", "nack", "close"]), max_size=15)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(returns=RETURNS, series=st.sampled_from(["3.13", "4.0", "4.3"]))
def test_counts_follow_the_versions_rule_whatever_the_returns(
    returns: list[str], series: str
) -> None:
    """x-delivery-count: every return before 4.3, only rejects and lost consumers on 4.3;
    x-acquired-count (4.3 only): every return. A limit above the returns keeps the message."""
    with InMemoryBroker(rabbitmq=series, manual_clock=True) as broker:
        declare(broker, "qq", **QUORUM, **{"x-delivery-limit": 100})
        put(broker, "qq")
        with broker.connect() as conn:
            ch = conn.channel()
            for kind in returns:
                method, _, _ = ch.basic_get("qq")
                if kind == "reject":
                    ch.basic_reject(method.delivery_tag, requeue=True)
                elif kind == "nack":
                    ch.basic_nack(method.delivery_tag, requeue=True)
                else:
                    ch.close()
                    ch = conn.channel()
            method, props, _ = ch.basic_get("qq", auto_ack=True)
        assert method is not None
        assert bool(method.redelivered) == bool(returns)
        counted = sum(k != "nack" for k in returns) if series == "4.3" else len(returns)
        delivery_count, acquired = counts_of(props.headers)
        assert delivery_count == (counted or None)
        assert acquired == (len(returns) or None if series == "4.3" else None)


def run_returns(broker: InMemoryBroker, queue: str, kind: str, times: int) -> int:
    """Take and return the message `times` times with `kind`; how many deliveries came."""
    delivered = 0
    with broker.connect() as conn:
        ch = conn.channel()
        for _ in range(times):
            method, _, _ = ch.basic_get(queue)
            if method is None:
                break
            delivered += 1
            if kind == "reject":
                ch.basic_reject(method.delivery_tag, requeue=True)
            else:
                ch.basic_nack(method.delivery_tag, requeue=True)
    return delivered


def test_4x_quorum_queues_have_the_default_delivery_limit_20(broker: InMemoryBroker) -> None:
    declare(broker, "dead")
    dlx = {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dead"}
    declare(broker, "qq", **QUORUM, **dlx)
    put(broker, "qq")
    delivered = run_returns(broker, "qq", "reject", 30)
    if broker.server_version().startswith("3."):
        assert delivered == 30 and broker.counts("qq").ready == 1
        return
    assert delivered == 21
    assert broker.counts("qq").total == 0
    (dead,) = broker.messages("dead")
    assert dead.headers["x-death"][0]["reason"] == "delivery_limit"
    assert "x-delivery-count" not in dead.headers and "x-acquired-count" not in dead.headers


def test_on_43_nacks_never_reach_the_delivery_limit() -> None:
    with InMemoryBroker(rabbitmq="4.3") as broker:
        declare(broker, "qq", **QUORUM, **{"x-delivery-limit": 2})
        put(broker, "qq")
        assert run_returns(broker, "qq", "nack", 10) == 10
        assert broker.counts("qq").ready == 1
        assert run_returns(broker, "qq", "reject", 10) == 3  # 2 rejects counted, then gone
        assert broker.counts("qq").total == 0
    with InMemoryBroker(rabbitmq="4.0") as broker:
        declare(broker, "qq", **QUORUM, **{"x-delivery-limit": 2})
        put(broker, "qq")
        assert run_returns(broker, "qq", "nack", 10) == 3


def test_a_publishers_x_death_counts_only_before_40(broker: InMemoryBroker) -> None:
    declare(broker, "dead")
    declare(broker, "q", **{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dead"})
    forged = [{"count": 5, "reason": "rejected", "queue": "q", "exchange": "", "time": 0}]
    put(broker, "q", **{"x-death": forged, "x-first-death-queue": "elsewhere"})
    with broker.connect() as conn:
        ch = conn.channel()
        method, _, _ = ch.basic_get("q")
        ch.basic_reject(method.delivery_tag, requeue=False)
    (dead,) = broker.messages("dead")
    (death,) = dead.headers["x-death"]
    if broker.server_version().startswith("3."):
        assert death["count"] == 6 and dead.headers["x-first-death-queue"] == "elsewhere"
    else:
        assert death["count"] == 1 and dead.headers["x-first-death-queue"] == "q"


def test_the_broker_continues_its_own_x_death_on_every_version(broker: InMemoryBroker) -> None:
    """a (TTL 0) dead-letters into b, b's reject dead-letters back into a: the broker's
    own x-death goes on counting on every version (4.x keeps it with the message)."""
    declare(
        broker,
        "a",
        **{"x-message-ttl": 0, "x-dead-letter-exchange": "", "x-dead-letter-routing-key": "b"},
    )
    declare(broker, "b", **{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "a"})
    put(broker, "a")
    with broker.connect() as conn:
        ch = conn.channel()
        for _ in range(2):
            method, _, _ = ch.basic_get("b")
            ch.basic_reject(method.delivery_tag, requeue=False)
    (msg,) = broker.messages("b")
    deaths = {(d["queue"], d["reason"]): d["count"] for d in msg.headers["x-death"]}
    assert deaths == {("a", "expired"): 3, ("b", "rejected"): 2}
    assert msg.headers["x-first-death-queue"] == "a"
    assert msg.headers["x-last-death-queue"] == "a"


REFUSED = [
    ("x-queue-version 1", {"arguments": {"x-queue-version": 1}}, "unsupported queue version"),
    ("x-queue-mode", {"arguments": {"x-queue-mode": "lazy"}}, "x-queue-mode"),
    ("transient non-exclusive", {"durable": False}, "transient_nonexcl_queues"),
]


@pytest.mark.parametrize(("what", "kw", "text"), REFUSED, ids=[r[0] for r in REFUSED])
def test_43_refuses_what_it_denies_and_older_rules_accept_it(
    broker: InMemoryBroker, what: str, kw: dict[str, Any], text: str
) -> None:
    kw = {"durable": True, **kw}
    with broker.connect() as conn:
        ch = conn.channel()
        if not broker.server_version().startswith("4.3"):
            ch.queue_declare("q", **kw)
            assert broker.counts("q").total == 0
            return
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
            ch.queue_declare("q", **kw)
    assert info.value.reply_code == 406 and text in info.value.reply_text
    assert "q" not in broker.counts_all()


def test_43_accepts_transient_exclusive_queues_and_refuses_global_qos() -> None:
    with InMemoryBroker(rabbitmq="4.3") as broker, broker.connect() as conn:
        ch = conn.channel()
        ch.queue_declare("mine", durable=False, exclusive=True)
        ch.basic_qos(prefetch_count=5)
        with pytest.raises(pika.exceptions.ChannelClosedByBroker, match="global_qos"):
            ch.basic_qos(prefetch_count=5, global_qos=True)
    with InMemoryBroker() as broker, broker.connect() as conn:
        conn.channel().basic_qos(prefetch_count=5, global_qos=True)


@pytest.mark.parametrize(
    ("env", "want"), [(None, "3.13.7"), ("3.10", "3.13.7"), ("4.0", "4.0.5"), ("4.3", "4.3.6")]
)
def test_the_memory_fixtures_follow_the_kits_rabbitmq_option(
    monkeypatch: pytest.MonkeyPatch, env: str | None, want: str
) -> None:
    if env is None:
        monkeypatch.delenv("ACKKIT_TEST_RABBITMQ", raising=False)
    else:
        monkeypatch.setenv("ACKKIT_TEST_RABBITMQ", env)
    with InMemoryBroker(rabbitmq=kit_plugin._memory_rabbitmq()) as b:
        assert b.server_version() == want
