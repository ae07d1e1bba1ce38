"""Pull mode and the dead-letter tools against whatever is in the queue.

Pull mode (both runtimes): thousands of messages get() must dead-letter in a
row, settles right before close, settles after close, cancelled gets, threads,
a channel lost between get and settle. DLQ tools: a dead-letter queue mixing
ordinary dead letters with hostile headers (garbage x-death, wrong-typed ackkit
headers, invalid UTF-8) - every message listed, replay moves all it can, the
broker's counts add up exactly.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import uuid
from typing import Any

import pika
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

import ackkit
from ackkit._core import headers as H
from ackkit._core.errors import SettleNotAllowed
from ackkit.cli import build_cli
from ackkit.dead_letters._queue import DeadLetterQueue, inspect_dead_letters, replay_dead_letters
from tests.contract.conftest import Broker, LoopThread, Runtime

pytestmark = [pytest.mark.integration, pytest.mark.one_leg]


def declare(url: str, *queues: str) -> None:
    with ackkit.connect(url) as c:
        for q in queues:
            c.declare_queue(q)


def publish_raw(url: str, queue: str, items: list[tuple[str, dict[str, Any] | None]]) -> None:
    """Publish (message_id, headers) pairs with confirms, headers exactly as given."""
    conn = pika.BlockingConnection(pika.URLParameters(url))
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        for mid, headers in items:
            props = pika.BasicProperties(message_id=mid, headers=headers, delivery_mode=2)
            ch.basic_publish("", queue, mid.encode(), props, mandatory=True)
    finally:
        conn.close()


# -- pull mode ----------------------------------------------------------------------


def test_get_dead_letters_2000_in_a_row_then_returns_the_good_one(
    runtime: Runtime, broker: Broker, fresh_queue: str
) -> None:
    q = fresh_queue
    declare(broker.handle.url, q)
    broker.publish(q, ["{}"] * 2000, headers={H.ATTEMPT: "garbage"})
    broker.publish(q, ['{"good": 1}'])
    with runtime.pull() as pull:
        d = pull.get(q, max_seconds=300)  # what is tested is the loop, not the time bound
        assert d is not None and d.body == b'{"good": 1}'
        pull.ack(d)
        assert pull.get(q) is None
    broker.wait_for(f"{q}.dlq", ready=2000, unacked=0, timeout=30)
    broker.wait_for(q, ready=0, unacked=0)


def test_get_is_bounded_per_call(broker: Broker, fresh_queue: str) -> None:
    q = fresh_queue
    declare(broker.handle.url, q)
    broker.publish(q, ["{}"] * 30, headers={H.ATTEMPT: -1})
    broker.publish(q, ['"good"'])
    with ackkit.connect(broker.handle.url) as c:
        assert c.get(q, max_skip=10) is None  # bounded: 10 settled, queue not empty
        broker.wait_for(f"{q}.dlq", ready=10)
        assert c.get(q, max_skip=10) is None
        d = c.get(q, max_skip=11)
        assert d is not None and d.body == b'"good"'
        d.ack()
    broker.wait_for(f"{q}.dlq", ready=30, unacked=0)
    broker.wait_for(q, ready=0, unacked=0)


@pytest.mark.parametrize("leave", ["normally", "by an exception"])
def test_async_ack_then_leaving_the_context_reaches_the_broker(
    broker: Broker, fresh_queue: str, leave: str
) -> None:
    q, n = fresh_queue, 5
    declare(broker.handle.url, q)
    broker.publish(q, ["{}"] * n)

    async def once() -> None:
        async with ackkit.aconnect(broker.handle.url) as c:
            d = await c.get(q)
            assert d is not None
            await d.ack()
            if leave != "normally":
                raise KeyError("leaving with an exception")

    for i in range(n):
        with contextlib.suppress(KeyError):
            asyncio.run(once())
        c = broker.counts(q)
        assert (c.ready, c.unacked) == (n - i - 1, 0), c


@pytest.mark.parametrize("leave", ["normally", "by an exception"])
def test_sync_ack_then_leaving_the_context_reaches_the_broker(
    broker: Broker, fresh_queue: str, leave: str
) -> None:
    q, n = fresh_queue, 5
    declare(broker.handle.url, q)
    broker.publish(q, ["{}"] * n)
    for i in range(n):
        try:
            with ackkit.connect(broker.handle.url) as c:
                d = c.get(q)
                assert d is not None
                d.reject(requeue=False) if i % 2 else d.ack()
                if leave != "normally":
                    raise KeyError("leaving with an exception")
        except KeyError:
            pass
        c2 = broker.counts(q)
        assert (c2.ready, c2.unacked) == (n - i - 1, 0), c2
    broker.wait_for(f"{q}.dlq", ready=n // 2)


def test_closed_pull_connections_refuse_clearly(broker: Broker, fresh_queue: str) -> None:
    q = fresh_queue
    declare(broker.handle.url, q)
    broker.publish(q, ["1", "2"])
    c = ackkit.pull.PullConnection(broker.handle.url)
    d = c.get(q)
    assert d is not None
    c.close()
    c.close()  # a second close does nothing
    with pytest.raises(SettleNotAllowed, match="closed"):
        d.ack()
    with pytest.raises(RuntimeError, match="closed"):
        c.get(q)
    with pytest.raises(RuntimeError, match="closed"):
        c.publish(q, b"x")
    broker.wait_for(q, ready=2, unacked=0)  # the unsettled one went back

    async def run() -> None:
        ac = await ackkit.pull.AsyncPullConnection(broker.handle.url).open()
        d = await ac.get(q)
        assert d is not None
        await ac.close()
        await ac.close()
        with pytest.raises(SettleNotAllowed, match="closed"):
            await d.ack()  # type: ignore[func-returns-value]
        with pytest.raises(RuntimeError, match="closed"):
            await ac.get(q)

    asyncio.run(run())
    broker.wait_for(q, ready=2, unacked=0)


def test_sync_settle_after_a_lost_channel_never_sends_the_stale_tag(
    broker: Broker, fresh_queue: str
) -> None:
    q = fresh_queue
    declare(broker.handle.url, q)
    broker.publish(q, ['"old"', '"new"'])
    with ackkit.connect(broker.handle.url) as c:
        old = c.get(q)
        assert old is not None and old.delivery_tag == 1
        with pytest.raises(pika.exceptions.ChannelClosedByBroker):
            c.channel.basic_ack(999)  # PRECONDITION_FAILED: the channel is gone
            c.channel.queue_declare(q, passive=True)
        new = c.get(q)  # a new channel, where tag 1 is this delivery
        assert new is not None and new.delivery_tag == 1
        assert new.body == b'"old"' and new.redelivered  # requeued when the channel died
        old.ack()  # must not ack tag 1 of the new channel
        c2 = broker.counts(q)
        assert (c2.ready, c2.unacked) == (1, 1), c2  # the stale ack was not sent
        new.ack()
    broker.wait_for(q, ready=1, unacked=0)


def test_async_settle_after_a_lost_channel_never_sends_the_stale_tag(
    broker: Broker, fresh_queue: str
) -> None:
    q = fresh_queue
    declare(broker.handle.url, q)
    broker.publish(q, ['"old"', '"new"'])

    async def run() -> None:
        async with ackkit.aconnect(broker.handle.url) as c:
            old = await c.get(q)
            assert old is not None and old.delivery_tag == 1
            ch = await c._channel()
            await ch.basic_ack(999)
            await asyncio.sleep(0.5)  # the broker closes the channel
            new = await c.get(q)
            assert new is not None and new.delivery_tag == 1
            assert new.body == b'"old"' and new.redelivered
            await old.ack()  # type: ignore[func-returns-value]
            c2 = broker.counts(q)
            assert (c2.ready, c2.unacked) == (1, 1), c2  # the stale ack was not sent
            await new.ack()  # type: ignore[func-returns-value]

    asyncio.run(run())
    broker.wait_for(q, ready=1, unacked=0)


def test_cancelled_async_gets_lose_nothing(
    broker: Broker, fresh_queue: str, loop_thread: LoopThread
) -> None:
    q, n = fresh_queue, 40
    declare(broker.handle.url, q)
    broker.publish(q, [str(i) for i in range(n)])
    acked: list[bytes] = []

    async def run(spins: int) -> int:
        cancelled = 0
        async with ackkit.aconnect(broker.handle.url) as c:
            for i in range(12):
                t = asyncio.ensure_future(c.get(q))
                for _ in range((i * spins) % 9):
                    await asyncio.sleep(0)
                t.cancel()
                try:
                    d = await t
                except asyncio.CancelledError:
                    cancelled += 1
                    continue
                if d is not None:
                    acked.append(d.body)
                    await d.ack()  # type: ignore[func-returns-value]
        return cancelled

    cancelled = sum(loop_thread.run(run(spins)) for spins in (1, 2, 3, 5))
    assert cancelled > 0
    c = broker.counts(q)
    assert (c.ready + len(acked), c.unacked) == (n, 0), (c, len(acked))
    assert len(set(acked)) == len(acked)


def test_sync_get_from_threads_settles_each_message_once(broker: Broker, fresh_queue: str) -> None:
    q, n = fresh_queue, 300
    declare(broker.handle.url, q)
    broker.publish(q, [str(i) for i in range(n)])
    seen: list[bytes] = []
    errors: list[BaseException] = []
    with ackkit.connect(broker.handle.url) as c:

        def work() -> None:
            try:
                while (d := c.get(q)) is not None:
                    seen.append(d.body)
                    d.ack() if len(d.body) % 2 else d.nack(requeue=False)
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=work) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    assert not errors
    assert sorted(seen) == sorted(str(i).encode() for i in range(n))
    broker.wait_for(q, ready=0, unacked=0)
    broker.wait_for(f"{q}.dlq", ready=sum(1 for i in range(n) if len(str(i)) % 2 == 0))


# -- DLQ tools --------------------------------------------------------------------


# Values pika can encode (and a producer may put anywhere), nested.
wire_values = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(min_value=-(2**63), max_value=2**63 - 1),
        st.text(max_size=30),
        st.binary(max_size=20),
        st.sampled_from([b"\xff\xfe\xc3", "[red]x[/]", "\x1b[2J", "9" * 400, "q" * 300]),
    ),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=10,
)
garbage_x_death = st.one_of(
    wire_values,
    st.lists(
        st.one_of(
            wire_values,
            st.fixed_dictionaries(
                {},
                optional={k: wire_values for k in ("queue", "reason", "routing-keys", "time")},
            ),
        ),
        max_size=4,
    ),
    st.integers(0, 3000).map(lambda k: [{"queue": 7, "reason": b"\xff"}] * k),
)
ackkit_fields = st.fixed_dictionaries(
    {H.REASON: wire_values},
    optional={
        k: wire_values
        for k in (H.ERROR_TYPE, H.ATTEMPTS, H.ORIGINAL_QUEUE, H.DEAD_LETTERED_AT, H.REPLAYED)
    },
)
hostile_headers = st.one_of(
    garbage_x_death.map(lambda x: {"x-death": x}),
    ackkit_fields,
    st.dictionaries(st.text(max_size=10), wire_values, max_size=4),
)


def fill_mixed_dlq(url: str, q: str, hostile: list[dict[str, Any]]) -> set[str]:
    """<q>.dlq with ordinary dead letters (ackkit's and a real broker x-death) and hostile ones."""
    dlq = f"{q}.dlq"
    declare(url, q, dlq)
    items: list[tuple[str, dict[str, Any] | None]] = [
        (f"ok-{i}", {H.REASON: "attempts exhausted", H.ORIGINAL_QUEUE: q, H.ATTEMPTS: 3})
        for i in range(3)
    ]
    items += [(f"bad-{i}", h) for i, h in enumerate(hostile)]
    items.append(("bad-bytes", {H.REASON: b"\xff\xfe", H.ORIGINAL_QUEUE: b"\xc3\x28"}))
    publish_raw(url, dlq, items)
    # A real x-death: the broker dead-letters it from a source queue into the DLQ.
    src = f"{q}.src"
    conn = pika.BlockingConnection(pika.URLParameters(url))
    try:
        ch = conn.channel()
        ch.queue_declare(
            src,
            arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq},
        )
        ch.confirm_delivery()
        ch.basic_publish("", src, b"x", pika.BasicProperties(message_id="broker-0"))
        m, _p, _b = ch.basic_get(src)
        ch.basic_reject(m.delivery_tag, requeue=False)
    finally:
        conn.close()
    return {mid for mid, _ in items} | {"broker-0"}


@settings(
    max_examples=10,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(hostile=st.lists(hostile_headers, min_size=1, max_size=6))
def test_dlq_tools_over_hostile_dead_letters(
    broker: Broker, queue_factory: Any, hostile: list[dict[str, Any]]
) -> None:
    url = broker.handle.url
    q = queue_factory()
    dlq, to = f"{q}.dlq", f"{q}.to"
    ids = fill_mixed_dlq(url, q, hostile)
    n = len(ids)
    broker.wait_for(dlq, ready=n)

    letters = inspect_dead_letters(url, dlq)
    assert {d.message_id for d in letters} == ids
    assert next(d for d in letters if d.message_id == "broker-0").source == "broker"
    assert any(d.notes for d in letters if d.message_id == "bad-bytes")
    broker.wait_for(dlq, ready=n, unacked=0)

    r = CliRunner().invoke(
        build_cli(), ["dlq", "inspect", dlq, "--limit", "0", "--json"], env={"AMQP_URL": url}
    )
    assert r.exit_code == 0, r.output
    data = json.loads(r.output)
    assert data["count"] == n and {m["message_id"] for m in data["messages"]} == ids
    r = CliRunner().invoke(
        build_cli(),
        ["dlq", "inspect", dlq, "--limit", "0"],
        env={"AMQP_URL": url, "COLUMNS": "400"},
    )
    assert r.exit_code == 0, r.output
    assert all(mid in r.output for mid in ids)

    # Replay to where each came from: what has a readable origin goes, the rest stays.
    src = f"{q}.src"
    try:
        report = replay_dead_letters(url, dlq)
        assert report.examined == n and report.replayed + report.left == n
        assert report.targets.get(q, 0) >= 3 and report.targets.get(src) == 1
        assert sum(report.targets.values()) == report.replayed
        for target, k in report.targets.items():
            c = broker.counts(target)
            assert (c.ready, c.unacked) == (k, 0), (target, c)
        c_dlq = broker.counts(dlq)
        assert (c_dlq.ready, c_dlq.unacked) == (report.left, 0) and report.remaining == report.left

        # The rest with the CLI and --to: every one moves, none twice.
        declare(url, to)
        r = CliRunner().invoke(
            build_cli(), ["dlq", "replay", dlq, "--to", to, "--json"], env={"AMQP_URL": url}
        )
        assert r.exit_code == 0, r.output
        rep = json.loads(r.output)
        assert (rep["examined"], rep["replayed"], rep["remaining"]) == (report.left,) * 2 + (0,)
        broker.wait_for(dlq, ready=0, unacked=0)
        broker.wait_for(to, ready=report.left, unacked=0)
        moved = {m.body.decode() for m in broker.take_all(to)}
        moved |= {m.body.decode() for t in report.targets for m in broker.take_all(t)}
        assert moved == ids - {"broker-0"} | {"x"}
    finally:
        with ackkit.connect(url) as c:
            c.channel.queue_delete(src)
            c.channel.queue_delete(to)


def test_replay_leaves_a_copy_it_cannot_publish_and_says_why(
    broker: Broker, fresh_queue: str
) -> None:
    url, q = broker.handle.url, fresh_queue
    dlq = f"{q}.dlq"
    declare(url, q, dlq)
    publish_raw(
        url,
        dlq,
        [
            ("ok", {H.REASON: "x", H.ORIGINAL_QUEUE: q}),
            ("nowhere", {H.REASON: "x", H.ORIGINAL_QUEUE: f"{q}.missing-{uuid.uuid4().hex}"}),
            ("no-origin", {H.REASON: "x", H.ORIGINAL_QUEUE: 42}),
        ],
    )
    with DeadLetterQueue(url, dlq) as d:
        report = d.replay()
    assert (report.replayed, report.failed, report.no_target) == (1, 1, 1)
    assert any("nowhere" in e and "Unroutable" in e for e in report.errors)
    assert any("no-origin" in e and H.ORIGINAL_QUEUE in e for e in report.errors)
    broker.wait_for(dlq, ready=2, unacked=0)
    broker.wait_for(q, ready=1)
