"""The in-memory broker does what RabbitMQ does with queue limits and policies: each case
runs on a real node and on the in-memory broker (under 3.13's and 4.3's rules).

x-max-length and x-max-length-bytes count ready messages only; drop-head,
reject-publish and reject-publish-dlx; a requeue over the limit; a quorum queue's
limits (its reject-publish and, on 4.x, its byte count); policies combined with the
queue's own arguments. Through a plain pika BlockingConnection (the kit's `connect()`).
"""

from __future__ import annotations

import contextlib
import re
from typing import Any

import pytest

from ackkit.testing import BrokerError

from .conftest import Broker, eventually
from .fidelity import bodies, deaths, declare, publish, transport

pytestmark = pytest.mark.contract
__all__ = ["transport"]  # every case runs on the in-memory broker under 4.3's rules too


# -- x-max-length and x-max-length-bytes -----------------------------------------------------


@pytest.mark.parametrize("kind", ["classic", "quorum"])
@pytest.mark.parametrize("overflow", ["drop-head", "reject-publish"])
def test_max_length_counts_only_ready_messages(
    broker: Broker, queue_factory: Any, overflow: str, kind: str
) -> None:
    """Unacknowledged messages do not count toward x-max-length: with 2 of 2 taken by a
    consumer, 2 more are accepted. Then a drop-head queue drops from its head; a classic
    reject-publish queue refuses what would take it over; a quorum one accepts the
    publish that takes it over and refuses the next ones."""
    q, dead = queue_factory(), queue_factory("dead", declare=True)
    declare(
        broker,
        q,
        **{
            "x-max-length": 2,
            "x-overflow": overflow,
            "x-dead-letter-exchange": "",
            "x-dead-letter-routing-key": dead,
            "x-queue-type": kind,
        },
    )
    conn = broker.handle.connect()
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        assert publish(ch, q, b"1", b"2") == [True, True]
        taken = [ch.basic_get(q)[0] for _ in range(2)]
        assert all(m is not None for m in taken)
        assert publish(ch, q, b"3", b"4") == [True, True]
        c = broker.counts(q)
        assert (c.ready, c.unacked) == (2, 2)
        accepted = publish(ch, q, b"5", b"6")
        for m in taken:
            ch.basic_ack(m.delivery_tag)
    finally:
        conn.close()
    want = {
        "drop-head": ([True, True], [b"5", b"6"], [(b"3", "maxlen"), (b"4", "maxlen")]),
        "reject-publish-classic": ([False, False], [b"3", b"4"], []),
        "reject-publish-quorum": ([True, False], [b"3", b"4", b"5"], []),
    }
    key = overflow if overflow == "drop-head" else f"{overflow}-{kind}"
    # a dropped head is dead-lettered (maxlen); a refused publish is not
    assert (accepted, bodies(broker, q), deaths(broker, dead)) == want[key]


@pytest.mark.parametrize("overflow", ["drop-head", "reject-publish"])
def test_max_length_bytes_counts_the_bodies_of_ready_messages(
    broker: Broker, queue_factory: Any, overflow: str
) -> None:
    """A classic queue's x-max-length-bytes 10 holds two 4-byte bodies and a 2-byte one
    (10 bytes, not over: headers do not count); bytes a consumer holds unacknowledged do
    not count."""
    kind = "classic"
    q, dead = queue_factory(), queue_factory("dead", declare=True)
    declare(
        broker,
        q,
        **{
            "x-max-length-bytes": 10,
            "x-overflow": overflow,
            "x-dead-letter-exchange": "",
            "x-dead-letter-routing-key": dead,
            "x-queue-type": kind,
        },
    )
    conn = broker.handle.connect()
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        headers = {"a-long-header-that-does-not-count": "x" * 100}
        assert publish(ch, q, b"aaaa", b"bbbb", b"cc", headers=headers) == [True] * 3
        accepted = publish(ch, q, b"dddd")
        taken = []
        for more in (b"eeee", b"ffff"):
            m, _, body = ch.basic_get(q)  # its bytes leave the ready ones
            taken.append(body)
            accepted += publish(ch, q, more)
            ch.basic_ack(m.delivery_tag)
    finally:
        conn.close()
    want = {
        "drop-head": (
            [True, True, True],
            [b"bbbb", b"cc"],
            [b"eeee", b"ffff"],
            [(b"aaaa", "maxlen"), (b"dddd", "maxlen")],
        ),
        "reject-publish-classic": (
            [False, True, True],
            [b"aaaa", b"bbbb"],
            [b"cc", b"eeee", b"ffff"],
            [],
        ),
    }
    key = overflow if overflow == "drop-head" else f"{overflow}-{kind}"
    assert (accepted, taken, bodies(broker, q), deaths(broker, dead)) == want[key]


@pytest.mark.parametrize("overflow", ["drop-head", "reject-publish"])
def test_quorum_max_length_bytes(broker: Broker, queue_factory: Any, overflow: str) -> None:
    """A quorum queue's x-max-length-bytes 12, five 4-byte bodies without properties:
    RabbitMQ 3.x counts the bodies (4 bytes each), 4.x the properties too (6 bytes each:
    2 bytes of property flags). reject-publish accepts the publish that takes it over the
    limit, refuses after it, and takes publishes again once the ready bytes are down to
    80% of the limit (rabbit_fifo's soft limit)."""
    q, dead = queue_factory(), queue_factory("dead", declare=True)
    declare(
        broker,
        q,
        **{
            "x-queue-type": "quorum",
            "x-max-length-bytes": 12,
            "x-overflow": overflow,
            "x-dead-letter-exchange": "",
            "x-dead-letter-routing-key": dead,
        },
    )
    v4 = broker.handle.server_version().startswith("4.")
    conn = broker.handle.connect()
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        accepted = publish(ch, q, b"1111", b"2222", b"3333", b"4444", b"5555")
        if overflow == "reject-publish":
            for _ in range(2):
                m, _, _ = ch.basic_get(q)
                ch.basic_ack(m.delivery_tag)
            accepted += publish(ch, q, b"6666")
    finally:
        conn.close()
    kept, dropped = bodies(broker, q), [b for b, _ in deaths(broker, dead)]
    if overflow == "drop-head":
        assert accepted == [True] * 5
        if v4:
            assert (kept, dropped) == ([b"4444", b"5555"], [b"1111", b"2222", b"3333"])
        else:
            assert (kept, dropped) == ([b"3333", b"4444", b"5555"], [b"1111", b"2222"])
    elif v4:  # 1, 2 fit (12); 3 takes it over (18); 1, 2 taken: 6 <= 9.6
        assert (accepted, kept, dropped) == (
            [True] * 3 + [False] * 2 + [True],
            [b"3333", b"6666"],
            [],
        )
    else:  # 1, 2, 3 fit (12); 4 takes it over (16); 1, 2 taken: 8 <= 9.6
        assert (accepted, kept, dropped) == (
            [True] * 4 + [False, True],
            [b"3333", b"4444", b"6666"],
            [],
        )


def test_reject_publish_dlx_refuses_and_dead_letters(broker: Broker, queue_factory: Any) -> None:
    """x-overflow reject-publish-dlx: the publish over the limit is nacked AND the
    refused message is dead-lettered (reason maxlen)."""
    q, dead = queue_factory(), queue_factory("dead", declare=True)
    declare(
        broker,
        q,
        **{
            "x-max-length": 1,
            "x-overflow": "reject-publish-dlx",
            "x-dead-letter-exchange": "",
            "x-dead-letter-routing-key": dead,
        },
    )
    conn = broker.handle.connect()
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        assert publish(ch, q, b"kept", b"refused") == [True, False]
    finally:
        conn.close()
    assert bodies(broker, q) == [b"kept"]
    eventually(lambda: broker.counts(dead).ready == 1, what="the refused message dead-lettered")
    assert deaths(broker, dead) == [(b"refused", "maxlen")]


@pytest.mark.parametrize("overflow", ["drop-head", "reject-publish"])
def test_a_requeue_over_the_limit(broker: Broker, queue_factory: Any, overflow: str) -> None:
    """A message requeued into a full queue comes back to its place (the head): a
    drop-head queue then drops from the head until it is within its limit again; a
    reject-publish queue keeps it (only publishes are refused), over its limit."""
    q, dead = queue_factory(), queue_factory("dead", declare=True)
    declare(
        broker,
        q,
        **{
            "x-max-length": 2,
            "x-overflow": overflow,
            "x-dead-letter-exchange": "",
            "x-dead-letter-routing-key": dead,
        },
    )
    conn = broker.handle.connect()
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        publish(ch, q, b"1")
        m, _, _ = ch.basic_get(q)
        publish(ch, q, b"2", b"3")
        ch.basic_nack(m.delivery_tag, requeue=True)
        broker.wait_for(q, unacked=0)
    finally:
        conn.close()
    if overflow == "drop-head":
        assert bodies(broker, q) == [b"2", b"3"]
        assert deaths(broker, dead) == [(b"1", "maxlen")]
    else:
        assert bodies(broker, q) == [b"1", b"2", b"3"]
        assert deaths(broker, dead) == []


# -- policies ----------------------------------------------------------------------------------


def test_a_policy_combines_with_the_queues_arguments(broker: Broker, queue_factory: Any) -> None:
    """An operator's policy max-length 1 / overflow drop-head on a queue declared with
    x-max-length 3 / x-overflow reject-publish: the lower limit applies (1) and the
    queue's own overflow (reject-publish). Cleared, the queue's own limit is back."""
    q = queue_factory()
    declare(broker, q, **{"x-max-length": 3, "x-overflow": "reject-publish"})
    name = f"fidelity-{q}"
    pattern = f"^{re.escape(q)}$"
    broker.handle.set_policy(name, pattern, {"max-length": 1, "overflow": "drop-head"}, wait_for=q)
    conn = broker.handle.connect()
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        assert broker.handle.policy_of(q) == name
        assert publish(ch, q, b"1", b"2") == [True, False]
        broker.handle.clear_policy(name, wait_for=q)
        assert publish(ch, q, b"3", b"4", b"5") == [True, True, False]
    finally:
        conn.close()
        with contextlib.suppress(Exception):
            broker.handle.clear_policy(name)
    assert bodies(broker, q) == [b"1", b"3", b"4"]


def test_a_policy_the_node_refuses_raises_its_reason(
    broker: Broker, queue_factory: Any, transport: str
) -> None:
    """A policy value RabbitMQ refuses (a length that is no number) raises BrokerError
    with the node's own reason, and sets nothing. The in-memory broker checks a policy's
    names, not its values: this is about the real node's control path."""
    if transport != "rabbitmq":
        pytest.skip("the in-memory broker does not check policy values")
    q = queue_factory()
    declare(broker, q)
    name = f"fidelity-{q}"
    with pytest.raises(BrokerError, match="not a valid maximum length"):
        broker.handle.set_policy(name, f"^{re.escape(q)}$", {"max-length": "many"})
    assert broker.handle.policy_of(q) is None
    with pytest.raises(BrokerError):
        broker.handle.clear_policy(name)  # there is none to clear


def test_a_policy_dead_letters_a_queue_that_has_no_dlx(broker: Broker, queue_factory: Any) -> None:
    """A policy can give a queue its dead-letter exchange and a message TTL: the
    message expires into the policy's dead-letter queue, reason expired."""
    q, dead = queue_factory(), queue_factory("dead", declare=True)
    declare(broker, q)
    name = f"fidelity-{q}"
    definition = {"message-ttl": 50, "dead-letter-exchange": "", "dead-letter-routing-key": dead}
    broker.handle.set_policy(name, f"^{re.escape(q)}$", definition, priority=5, wait_for=q)
    try:
        conn = broker.handle.connect()
        try:
            ch = conn.channel()
            ch.confirm_delivery()
            publish(ch, q, b"late")
        finally:
            conn.close()
        eventually(lambda: broker.counts(dead).ready == 1, timeout=5, what="dead-lettered")
    finally:
        broker.handle.clear_policy(name)
    assert broker.counts(q).ready == 0
    assert deaths(broker, dead) == [(b"late", "expired")]
