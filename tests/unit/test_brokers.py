"""Broker traits: chosen from the version a connection reports, and what the core decides
from them (no broker needed)."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import ackkit
from ackkit import Retry, RetryLater, RetryStrategy
from ackkit._core import headers as H
from ackkit._core.actions import Ack, Reject, Republish
from ackkit._core.brokers import (
    UNKNOWN,
    V3,
    V40,
    V43,
    BrokerTraits,
    CountSource,
    parse_version,
    traits_for,
    traits_of,
)
from ackkit._core.events import Stage
from ackkit._core.listener import ListenerCore
from ackkit._core.policy import ListenerPolicy
from ackkit._core.topology import check_delivery_limit, declarable
from ackkit.errors import TopologyConflict
from tests.unit._fakes import parse_source

KNOWN = (V3, V40, V43)


@pytest.mark.parametrize(
    ("raw", "series", "version"),
    [
        ("3.10.8", "3.x", (3, 10, 8)),
        (b"3.13.7", "3.x", (3, 13, 7)),
        ("4.0.5", "4.0-4.2", (4, 0, 5)),
        ("4.2.1", "4.0-4.2", (4, 2, 1)),
        ("4.3.6", "4.3+", (4, 3, 6)),
        ("4.3.0-rc.0", "4.3+", (4, 3, 0)),
        ("4.3.6+rc.1", "4.3+", (4, 3, 6)),
        ("4.3", "4.3+", (4, 3, 0)),
        ("5.0.0", "4.3+", (5, 0, 0)),  # newer than we know: the newest semantics
        ("", "unknown", None),
        ("garbage", "unknown", None),
        ("2.8.7", "unknown", None),  # not a version ackkit supports
        ("4..3", "unknown", None),
        ("4.3.6.7.8", "unknown", None),
        (None, "unknown", None),
        (4.3, "unknown", None),
    ],
)
def test_traits_from_the_reported_version(raw: object, series: str, version: Any) -> None:
    t = traits_for(raw)
    assert t.series == series and t.version == version


@given(st.one_of(st.text(max_size=200), st.binary(max_size=200), st.integers(), st.none()))
def test_any_reported_version_gives_traits_never_an_error(raw: object) -> None:
    t = traits_for(raw)
    assert isinstance(t, BrokerTraits)
    v = parse_version(raw)
    if v is None or v[0] < 3:
        assert t == UNKNOWN
    else:
        assert t.version == v and t.series != "unknown"


@given(st.text(alphabet="0123456789.+-rcv ", max_size=30))
def test_version_like_text_is_either_read_whole_or_unknown(raw: str) -> None:
    t = traits_for(raw)
    if t.version is not None:
        major, minor, _ = t.version
        head = re.match(r"\s*v?(\d+)\.(\d+)", raw)
        assert head is not None and (int(head[1]), int(head[2])) == (major, minor)
        rest = raw[head.end() :].lstrip("0123456789.")
        assert rest[:1] in ("", "-", "+", " ")
        assert major in (3, 4) or major >= 5


class Hostile:
    def get(self, key: str) -> Any:
        raise RuntimeError("no")


@pytest.mark.parametrize(
    "props",
    [None, {}, {"version": None}, {"version": ["4.3.6"]}, Hostile(), "4.3.6", {"version": "x"}],
)
def test_server_properties_that_say_nothing_usable_give_unknown(props: Any) -> None:
    assert traits_of(props) == UNKNOWN


def test_server_properties_of_a_43_broker() -> None:
    assert traits_of({"product": "RabbitMQ", "version": "4.3.6"}).series == "4.3+"


def test_the_unknown_broker_trusts_nothing_and_declares_nothing_newer_brokers_refuse() -> None:
    for qt in ("quorum", "classic", None, "stream"):
        assert UNKNOWN.count_source(qt) is CountSource.REDELIVERED
    assert not UNKNOWN.native_delayed_retry
    assert not UNKNOWN.classic_v1_arguments and not UNKNOWN.transient_queues
    assert not UNKNOWN.global_qos


@pytest.mark.parametrize(
    ("traits", "queue_type", "source"),
    [
        (V3, "quorum", CountSource.DELIVERY_COUNT),
        (V40, "quorum", CountSource.DELIVERY_COUNT),
        (V43, "quorum", CountSource.ACQUIRED_COUNT),
        (V3, "classic", CountSource.REDELIVERED),
        (V43, "classic", CountSource.REDELIVERED),
        (V43, None, CountSource.REDELIVERED),
        (V43, "stream", CountSource.REDELIVERED),
    ],
)
def test_count_source(traits: BrokerTraits, queue_type: str, source: CountSource) -> None:
    assert traits.count_source(queue_type) is source


def _core(traits: BrokerTraits, queue_type: str | None = "quorum") -> ListenerCore:
    policy = ListenerPolicy(name="l", queue="q", retry=Retry(max_attempts=3), queue_type=queue_type)
    c = ListenerCore(policy, broker=traits)
    c.channel_opened()
    return c


@pytest.mark.parametrize("traits", [*KNOWN, UNKNOWN])
@given(
    forged=st.dictionaries(
        st.sampled_from([H.X_DELIVERY_COUNT, H.X_ACQUIRED_COUNT]),
        st.one_of(st.integers(-5, 10**6), st.text(max_size=5)),
    )
)
def test_a_first_delivery_is_attempt_1_whatever_a_publisher_wrote(
    traits: BrokerTraits, forged: dict[str, Any]
) -> None:
    """RabbitMQ 4.3 hands a publisher's x-delivery-count / x-acquired-count through on the
    first delivery (seen on 4.3.6): a first delivery has no previous one."""
    t = _core(traits).receive(1, redelivered=False, headers=forged)
    assert t.attempt == 1 and t.verdict is None


def test_43_reads_the_acquired_count_not_a_forged_delivery_count() -> None:
    """Seen on 4.3.6: a publisher's x-delivery-count 7 survives a basic.nack (the broker
    writes the header only once it incremented the count); x-acquired-count is the
    broker's (1)."""
    t = _core(V43).receive(
        1, redelivered=True, headers={"x-delivery-count": 7, "x-acquired-count": 1}
    )
    assert t.attempt == 2 and t.verdict is None


def test_43_counts_a_consumer_timeout_that_the_delivery_count_misses() -> None:
    """After a consumer timeout 4.3 returns the message with x-acquired-count 1 and no
    x-delivery-count: the lost delivery still counts (else it would loop)."""
    c = _core(V43)
    t = c.receive(1, redelivered=True, headers={"x-acquired-count": 2})
    assert t.attempt == 3
    gone = c.receive(2, redelivered=True, headers={"x-acquired-count": 3})
    assert gone.verdict is not None and gone.verdict[0].purpose == "dead-letter"


def test_before_43_the_delivery_count_counts() -> None:
    for traits in (V3, V40):
        t = _core(traits).receive(
            1, redelivered=True, headers={"x-delivery-count": 1, "x-acquired-count": 9}
        )
        assert t.attempt == 2


@pytest.mark.parametrize("traits", [UNKNOWN, V3, V43])
def test_classic_queues_restamp_redeliveries_on_every_broker(traits: BrokerTraits) -> None:
    t = _core(traits, "classic").receive(1, redelivered=True, headers={"x-acquired-count": 0})
    assert t.attempt == 2
    assert t.verdict is not None and t.verdict[0].purpose == "restamp"


def test_an_unknown_broker_restamps_a_quorum_redelivery() -> None:
    t = _core(UNKNOWN).receive(1, redelivered=True, headers={"x-delivery-count": 0})
    assert t.verdict is not None and t.verdict[0].purpose == "restamp"


def test_use_broker_switches_the_counting_on_reconnect() -> None:
    c = _core(V3)
    assert c._count is CountSource.DELIVERY_COUNT
    c.use_broker(V43)  # the broker was upgraded while ackkit reconnected
    assert c._count is CountSource.ACQUIRED_COUNT and c.queues.broker is V43


# -- a consumer cancelled by the broker (RabbitMQ 4.3's consumer timeout) ---------------


def test_a_cancelled_consumer_fences_its_deliveries_like_a_closed_channel() -> None:
    c = _core(V43, "quorum")
    a, b = c.receive(1), c.receive(2)
    c.finish(a)  # its ack is held for the batch
    assert c.gauges().pending_acks == 1
    assert c.consumer_cancelled() == 1  # b was outstanding; a's pending ack is dropped
    assert c.counters.counts[Stage.CONSUMER_CANCELLED] == 1
    assert c.finish(b) == []  # its settle is never sent: the broker returned it
    assert c.counters.counts[Stage.DROPPED_STALE] == 1
    assert c.tick() == [] and c.drain() == []
    assert c.channel_closed() == 0  # the runtime then closes the channel: nothing left
    c.channel_opened()
    t = c.receive(1, redelivered=True, headers={"x-acquired-count": 1})
    assert t.attempt == 2
    c.finish(t)
    assert c.drain() == [Ack(1)]


# -- arguments a 4.3 broker refuses -------------------------------------------------------


@pytest.mark.parametrize("traits", [V43, UNKNOWN])
@given(
    extra=st.dictionaries(
        st.text(max_size=8).filter(lambda k: k not in ("x-queue-mode", "x-queue-version")),
        st.integers(),
        max_size=3,
    ),
    version=st.sampled_from([1, "1", 2, None]),
    mode=st.sampled_from(["lazy", "default", None]),
)
def test_classic_v1_arguments_are_left_off_where_refused(
    traits: BrokerTraits, extra: dict[str, Any], version: Any, mode: Any
) -> None:
    args: dict[str, Any] = dict(extra)
    if version is not None:
        args["x-queue-version"] = version
    if mode is not None:
        args["x-queue-mode"] = mode
    out, dropped = declarable(args, traits)
    assert "x-queue-mode" not in out
    assert out.get("x-queue-version") in (None, 2)
    assert {k: v for k, v in out.items() if k != "x-queue-version"} == extra
    assert len(dropped) == (mode is not None) + (version in (1, "1"))


@pytest.mark.parametrize("traits", [V3, V40])
def test_classic_v1_arguments_are_kept_before_43(traits: BrokerTraits) -> None:
    args = {"x-queue-mode": "lazy", "x-queue-version": 1}
    assert declarable(args, traits) == (args, ())


# -- what ackkit itself declares: never refused by 4.3 -----------------------------------


def _calls(name: str) -> list[tuple[str, ast.Call]]:
    root = Path(ackkit.__file__).parent
    out = []
    for path in root.rglob("*.py"):
        if path.parent.name == "testing":
            continue  # the test kit declares what its caller asks for
        for node in ast.walk(parse_source(path)):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == name:
                out.append((str(path.relative_to(root)), node))
    return out


def test_ackkit_declares_only_durable_queues() -> None:
    """Transient non-exclusive queues are deprecated in 4.x (deprecated feature
    transient_nonexcl_queues; an operator may deny them): every queue ackkit declares is
    durable (or only checked, passive)."""
    calls = _calls("queue_declare")
    assert len(calls) >= 5
    for where, call in calls:
        kw = {k.arg: k.value for k in call.keywords}
        durable, passive = kw.get("durable"), kw.get("passive")
        ok = (isinstance(durable, ast.Constant) and durable.value is True) or (
            isinstance(passive, ast.Constant) and passive.value is True
        )
        assert ok, f"{where}:{call.lineno} declares a queue that is not durable"


def test_ackkit_never_asks_for_global_qos() -> None:
    """basic.qos global=true is a denied deprecated feature on 4.3 (global_qos)."""
    calls = _calls("basic_qos")
    assert len(calls) >= 3
    for where, call in calls:
        names = {k.arg for k in call.keywords}
        assert not names & {"global_qos", "global_", "global"}, f"{where}:{call.lineno}"
        assert len(call.args) <= 2, f"{where}:{call.lineno}"


# -- RetryStrategy.QUORUM_DELAYED: RabbitMQ 4.3's native delayed retry ------------------

QD = RetryStrategy.QUORUM_DELAYED


@given(
    initial=st.floats(0.001, 100),
    ratio=st.floats(1, 50),
    attempts=st.integers(1, 200),
)
def test_quorum_delays_are_the_brokers_linear_ones(
    initial: float, ratio: float, attempts: int
) -> None:
    """min(min_delay * delivery_count, max_delay), as RabbitMQ computes it."""
    r = Retry(
        max_attempts=attempts, initial_interval=initial, max_interval=initial * ratio, strategy=QD
    )
    for n in (1, 2, attempts):
        assert r.delay(n) == min(initial * n, initial * ratio)
    expected = sum(min(initial * n, initial * ratio) for n in range(1, attempts))
    assert r.total_delay() == pytest.approx(expected, rel=1e-9, abs=1e-9)


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"multiplier": 3.0}, "multiplier"),
        ({"multiplier": 1.0}, "multiplier"),
        ({"jitter": 0.1}, "jitter"),
        ({"initial_interval": 0.0}, "initial_interval"),
        ({"initial_interval": 5.0, "max_interval": 1.0}, "initial_interval"),
    ],
)
def test_quorum_delayed_refuses_what_the_broker_cannot_do(kw: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Retry(max_attempts=3, strategy=QD, **kw)


@pytest.mark.parametrize("queue_type", [None, "classic"])
def test_quorum_delayed_needs_a_quorum_queue(queue_type: str | None) -> None:
    with pytest.raises(ValueError, match="needs a quorum queue"):
        ListenerPolicy(
            name="l", queue="q", retry=Retry(max_attempts=3, strategy=QD), queue_type=queue_type
        )


def _qd_core(traits: BrokerTraits = V43, **kw: Any) -> ListenerCore:
    retry = Retry(max_attempts=3, initial_interval=0.5, max_interval=2.0, strategy=QD, **kw)
    c = ListenerCore(
        ListenerPolicy(name="l", queue="q", retry=retry, queue_type="quorum"), broker=traits
    )
    c.channel_opened()
    return c


def test_a_quorum_delayed_failure_is_a_reject_with_requeue_then_a_dead_letter() -> None:
    c = _qd_core()
    t = c.receive(1)
    assert c.finish(t, ValueError("boom")) == [Reject(1, requeue=True)]
    assert c.counters.counts[Stage.RETRYING] == 1
    t2 = c.receive(2, redelivered=True, headers={"x-acquired-count": 1, "x-delivery-count": 1})
    assert t2.attempt == 2
    assert c.finish(t2, RetryLater("later", delay=60)) == [Reject(2, requeue=True)]
    t3 = c.receive(3, redelivered=True, headers={"x-acquired-count": 2, "x-delivery-count": 2})
    (dead,) = c.finish(t3, ValueError("boom"))
    assert isinstance(dead, Republish) and dead.purpose == "dead-letter"
    assert c.queues.topology()[0].purpose == "dead-letter" and len(c.queues.topology()) == 1


def test_quorum_delayed_declares_the_delay_on_the_queue() -> None:
    args, dropped = _qd_core().queues.queue_arguments({"x-queue-type": "quorum"})
    assert args == {
        "x-queue-type": "quorum",
        "x-delayed-retry-type": "failed",
        "x-delayed-retry-min": 500,
        "x-delayed-retry-max": 2000,
    }
    assert dropped == ()


@pytest.mark.parametrize("traits", [V3, V40, UNKNOWN])
def test_quorum_delayed_is_refused_by_a_broker_without_it(traits: BrokerTraits) -> None:
    c = _qd_core(traits)
    with pytest.raises(TopologyConflict, match=r"needs RabbitMQ 4\.3"):
        c.queues.check_broker()
    _qd_core(V43).queues.check_broker()
    _core(traits).queues.check_broker()  # other strategies: any broker


@pytest.mark.parametrize(("limit", "ok"), [(None, True), (2, False), (3, True), (100, True)])
def test_quorum_delayed_needs_a_delivery_limit_of_max_attempts(limit: int | None, ok: bool) -> None:
    args = {} if limit is None else {"x-delivery-limit": limit}
    retry = Retry(max_attempts=3, strategy=QD)
    if ok:
        check_delivery_limit(retry, args)
    else:
        with pytest.raises(ValueError, match="delivery-limit"):
            check_delivery_limit(retry, args)
    with pytest.raises(ValueError, match="delivery-limit is 20"):
        check_delivery_limit(Retry(max_attempts=21, strategy=QD), {})
    check_delivery_limit(Retry(max_attempts=21), {})  # broker retries: fresh copies


@pytest.mark.parametrize(
    ("raw", "kinds"),
    [
        ("3.10.8", ("consistent",)),
        ("4.0.5", ("consistent",)),
        ("4.2.1", ("consistent",)),
        ("4.3.6", ("modulus", "consistent")),
        ("5.0.0", ("modulus", "consistent")),
        (None, ("modulus", "consistent")),  # unknown: try both, the broker says which it has
    ],
)
def test_shard_layouts_follow_the_broker_version(raw: object, kinds: tuple[str, ...]) -> None:
    from ackkit.shards import auto_kinds

    assert tuple(k.value for k in auto_kinds(traits_for(raw))) == kinds
