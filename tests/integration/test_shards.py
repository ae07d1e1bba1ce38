"""Shard layouts on a real broker: which queue each key lands in, as the broker shows it.

The exchange kinds depend on the broker: x-modulus-hash is built into RabbitMQ 4.3+,
x-consistent-hash needs its (bundled) plugin enabled. `declare_shards(kind=AUTO)` takes
what the broker has, or fails with a message saying what to enable; both outcomes are
checked against whichever broker the run uses.
"""

from __future__ import annotations

from collections import defaultdict

import pika
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ackkit.shards import (
    ShardKind,
    ShardLayout,
    ShardPublisher,
    declare_shards,
    shard_queues,
)

pytestmark = [pytest.mark.integration]


@given(key=st.text(max_size=60), shards=st.integers(1, 64))
@settings(max_examples=200, deadline=None)
def test_client_rule_is_stable_and_in_range(key: str, shards: int) -> None:
    layout = ShardLayout("orders", shards, ShardKind.CLIENT)
    ex, rk = layout.route(key)
    assert ex == "" and rk in layout.queues
    assert rk == ShardLayout("orders", shards, ShardKind.CLIENT).queue_for(key.encode())


def test_bad_layouts_are_refused_at_once() -> None:
    for bad in (0, -1, 1025, True, 2.0):
        with pytest.raises(ValueError, match="shards"):
            shard_queues("orders", bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="AUTO"):
        ShardLayout("orders", 2, ShardKind.AUTO)
    with pytest.raises(ValueError, match="255"):
        ShardLayout("orders", 2, ShardKind.MODULUS).route("k" * 256)


def _drain(url: str, layout: ShardLayout) -> dict[str, list[str]]:
    """queue -> message ids in the order the queue holds them (consumed, acked)."""
    out: dict[str, list[str]] = defaultdict(list)
    conn = pika.BlockingConnection(pika.URLParameters(url))
    try:
        ch = conn.channel()
        for q in layout.queues:
            while True:
                method, props, _ = ch.basic_get(q, auto_ack=True)
                if method is None:
                    break
                out[q].append(props.message_id)
    finally:
        conn.close()
    return out


def _publish(url: str, layout: ShardLayout, n: int, keys: int) -> dict[str, str]:
    """n messages over `keys` keys with confirms; returns message id -> key."""
    sent: dict[str, str] = {}
    conn = pika.BlockingConnection(pika.URLParameters(url))
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        pub = ShardPublisher(ch, layout)
        for i in range(n):
            key = f"customer-{i % keys}"
            mid = f"m{i:05d}"
            pub.publish(key, b"{}", pika.BasicProperties(message_id=mid), mandatory=True)
            sent[mid] = key
    finally:
        conn.close()
    return sent


def _check_routing(url: str, layout: ShardLayout, n: int = 400, keys: int = 40) -> None:
    sent = _publish(url, layout, n, keys)
    held = _drain(url, layout)
    assert sorted(m for ms in held.values() for m in ms) == sorted(sent)  # each once
    home: dict[str, str] = {}
    for q, mids in held.items():
        assert mids == sorted(mids), q  # a queue keeps publish order
        for m in mids:
            assert home.setdefault(sent[m], q) == q  # one queue per key
    assert len(held) == layout.shards  # 40 keys spread over every shard


def test_client_kind_declares_the_queues_and_routes_by_key(amqp_url, queue_factory) -> None:
    name = queue_factory("client")
    layout = declare_shards(amqp_url, name, 3, kind="client")
    assert layout.kind is ShardKind.CLIENT and layout.exchange == ""
    _check_routing(amqp_url, layout)
    for m_key in ("customer-1", "customer-2"):
        assert layout.route(m_key)[1] == layout.queue_for(m_key)


def test_auto_takes_the_hash_exchange_the_broker_has_or_says_what_to_enable(
    amqp_url, queue_factory
) -> None:
    name = queue_factory("auto")
    try:
        layout = declare_shards(amqp_url, name, 3)
    except ValueError as exc:
        # Neither x-modulus-hash (4.3+) nor the consistent-hash plugin on this broker.
        assert "rabbitmq_consistent_hash_exchange" in str(exc)
        assert "kind='client'" in str(exc)
        return
    assert layout.kind in (ShardKind.MODULUS, ShardKind.CONSISTENT)
    assert layout.exchange == name
    _check_routing(amqp_url, layout)
    # Declaring the same layout again changes nothing.
    assert declare_shards(amqp_url, name, 3) == layout
