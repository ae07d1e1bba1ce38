"""Shard layouts on a real broker: which queue each key lands in, as the broker shows it.

The exchange kinds depend on the broker: x-modulus-hash is built into RabbitMQ 4.3+,
x-consistent-hash needs its (bundled) plugin enabled. The test kit's own brokers (3.10,
4.x nodes, containers) run that plugin, so both kinds are exercised on them; on a broker
of AMQP_URL without the plugin the x-consistent-hash tests skip and say why.
`declare_shards(kind=AUTO)` takes what the broker has (x-modulus-hash on 4.3+), or fails
with a message saying what to enable.
"""

from __future__ import annotations

import json
from collections import defaultdict

import pika
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ackkit._core.brokers import traits_for
from ackkit.shards import (
    ShardKind,
    ShardLayout,
    ShardPublisher,
    auto_kinds,
    declare_shards,
    shard_queues,
)

pytestmark = [pytest.mark.integration, pytest.mark.one_leg]


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


def _publish(
    url: str, layout: ShardLayout, n: int, keys: int, *, prefix: str = "m"
) -> dict[str, str]:
    """n messages over `keys` keys with confirms; returns message id -> key.

    Message ids sort in publish order (`<prefix><i>`); `keys=1` sends all with one key."""
    sent: dict[str, str] = {}
    conn = pika.BlockingConnection(pika.URLParameters(url))
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        pub = ShardPublisher(ch, layout)
        for i in range(n):
            key = f"customer-{i % keys}" if keys > 1 else "customer-solo"
            mid = f"{prefix}{i:05d}"
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
    amqp_url, rabbitmq, queue_factory
) -> None:
    name = queue_factory("auto")
    traits = traits_for(rabbitmq.server_version())
    try:
        layout = declare_shards(amqp_url, name, 3)
    except ValueError as exc:
        # Neither x-modulus-hash (4.3+) nor the consistent-hash plugin on this broker,
        # which the test kit's own brokers always have.
        assert not rabbitmq.own, exc
        assert "rabbitmq_consistent_hash_exchange" in str(exc)
        assert "kind='client'" in str(exc)
        return
    # x-modulus-hash on 4.3+, x-consistent-hash before (the kit's brokers have its plugin).
    assert layout.kind is auto_kinds(traits)[0]
    assert layout.kind is (ShardKind.MODULUS if traits.series == "4.3+" else ShardKind.CONSISTENT)
    assert layout.exchange == name
    _check_routing(amqp_url, layout)
    # Declaring the same layout again changes nothing.
    assert declare_shards(amqp_url, name, 3) == layout


def _ctl_rows(rabbitmq, what: str, *fields: str) -> list[dict[str, str]]:
    text = rabbitmq.ctl(what, "-p", rabbitmq.vhost, "--formatter", "json", "--quiet", *fields)
    return json.loads(text)


def _declare_or_skip(rabbitmq, url: str, name: str, shards: int, kind: ShardKind) -> ShardLayout:
    """`declare_shards` of a hash kind; skips (with the reason) where the broker lacks it:
    x-modulus-hash before 4.3, x-consistent-hash on a broker of AMQP_URL without the
    plugin. The test kit's own brokers must have the plugin: there it is a failure."""
    version = rabbitmq.server_version()
    if kind is ShardKind.MODULUS and not traits_for(version).modulus_hash_exchange:
        pytest.skip(f"x-modulus-hash is built into RabbitMQ 4.3+, this broker is {version}")
    try:
        return declare_shards(url, name, shards, kind=kind)
    except ValueError:
        if kind is ShardKind.CONSISTENT and not rabbitmq.own:
            pytest.skip(
                f"the broker of AMQP_URL (RabbitMQ {version}) has no x-consistent-hash "
                "exchange: enable its plugin (rabbitmq-plugins enable "
                "rabbitmq_consistent_hash_exchange) to run this test"
            )
        raise


@pytest.mark.parametrize("kind", [ShardKind.CONSISTENT, ShardKind.MODULUS])
def test_hash_exchange_spreads_keys_over_the_shards_and_keeps_a_key_on_one(
    kind, amqp_url, rabbitmq, queue_factory
) -> None:
    name = queue_factory(kind.value)
    layout = _declare_or_skip(rabbitmq, amqp_url, name, 4, kind)
    assert layout == ShardLayout(name, 4, kind) and layout.exchange == name
    # The broker holds the exchange of that type, bound to each of the 4 queues.
    exchanges = {
        r["name"]: r["type"] for r in _ctl_rows(rabbitmq, "list_exchanges", "name", "type")
    }
    assert exchanges[name] == {"consistent": "x-consistent-hash"}.get(kind.value, "x-modulus-hash")
    bindings = sorted(
        (r["destination_name"], r["routing_key"])
        for r in _ctl_rows(
            rabbitmq, "list_bindings", "source_name", "destination_name", "routing_key"
        )
        if r["source_name"] == name
    )
    weight = "1" if kind is ShardKind.CONSISTENT else ""
    assert bindings == [(q, weight) for q in layout.queues]
    assert [rabbitmq.counts(q).ready for q in layout.queues] == [0, 0, 0, 0]

    # One key: all of its messages in one shard queue, the others untouched.
    solo = _publish(amqp_url, layout, 30, 1, prefix="a")
    counts = [rabbitmq.counts(q).ready for q in layout.queues]
    assert sorted(counts) == [0, 0, 0, 30], counts
    solo_queue = layout.queues[counts.index(30)]
    # Forty keys: every shard gets some; the solo key's queue gets no more of it.
    sent = _publish(amqp_url, layout, 400, 40)
    counts = [rabbitmq.counts(q).ready for q in layout.queues]
    assert sum(counts) == 430 and all(counts), counts
    held = _drain(amqp_url, layout)
    assert held[solo_queue][:30] == sorted(solo)
    sent.update(solo)
    home: dict[str, str] = {}
    for q, mids in held.items():
        assert mids == sorted(mids), q  # a queue keeps publish order
        for m in mids:
            assert home.setdefault(sent[m], q) == q  # one queue per key
    assert sorted(m for ms in held.values() for m in ms) == sorted(sent)  # each once
    assert [rabbitmq.counts(q).ready for q in layout.queues] == [0, 0, 0, 0]
