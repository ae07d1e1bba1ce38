"""The in-memory broker does what RabbitMQ does: one case, run on a real node and on the
test kit's in-memory broker (under 3.13's and 4.3's rules), asserting what the broker shows.

Queue limits (x-max-length, x-max-length-bytes and their overflow modes), argument
equivalence on re-declare, dead-letter cycles, a TTL of 0 with a consumer waiting,
exclusive consumers and the basic.cancel a deleted queue sends its consumers. The
limits and declares go through a plain pika BlockingConnection (the kit's
`connect()`); the consumer cases through the stand-ins the runtimes use: pika's
SelectConnection (`App`) and aiormq (`AsyncApp`), each opened by ackkit's own
connection functions, so a real node and the in-memory broker get the same calls.
"""

from __future__ import annotations

import contextlib
import queue as queues
import re
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import aiormq.exceptions
import pika
import pika.exceptions
import pytest

from ackkit import Delivery

from .conftest import IO, Broker, LoopThread, Runtime, eventually

pytestmark = pytest.mark.contract


@pytest.fixture
def transport(version_transport: str) -> str:
    """Every case runs on the in-memory broker under 3.13's and 4.3's rules too."""
    return version_transport


def _declare(broker: Broker, name: str, **args: Any) -> None:
    conn = broker.handle.connect()
    try:
        conn.channel().queue_declare(name, durable=True, arguments=args or None)
    finally:
        conn.close()


def _publish(ch: Any, queue: str, *bodies: bytes, **props: Any) -> list[bool]:
    """Publish with confirms on `ch`; for each body, whether the broker accepted it."""
    out = []
    for b in bodies:
        try:
            ch.basic_publish("", queue, b, pika.BasicProperties(**props))
            out.append(True)
        except pika.exceptions.NackError:
            out.append(False)
    return out


def _bodies(broker: Broker, queue: str) -> list[bytes]:
    return [m.body for m in broker.take_all(queue)]


def _deaths(broker: Broker, queue: str) -> list[tuple[bytes, str]]:
    """(body, x-death reason) of every message in the dead-letter queue `queue`."""
    out = []
    for m in broker.take_all(queue):
        (first, *_) = m.headers["x-death"]
        reason = first["reason"]
        out.append((m.body, reason.decode() if isinstance(reason, bytes) else reason))
    return out


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
    _declare(
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
        assert _publish(ch, q, b"1", b"2") == [True, True]
        taken = [ch.basic_get(q)[0] for _ in range(2)]
        assert all(m is not None for m in taken)
        assert _publish(ch, q, b"3", b"4") == [True, True]
        c = broker.counts(q)
        assert (c.ready, c.unacked) == (2, 2)
        accepted = _publish(ch, q, b"5", b"6")
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
    assert (accepted, _bodies(broker, q), _deaths(broker, dead)) == want[key]


@pytest.mark.parametrize("overflow", ["drop-head", "reject-publish"])
def test_max_length_bytes_counts_the_bodies_of_ready_messages(
    broker: Broker, queue_factory: Any, overflow: str
) -> None:
    """A classic queue's x-max-length-bytes 10 holds two 4-byte bodies and a 2-byte one
    (10 bytes, not over: headers do not count); bytes a consumer holds unacknowledged do
    not count."""
    kind = "classic"
    q, dead = queue_factory(), queue_factory("dead", declare=True)
    _declare(
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
        assert _publish(ch, q, b"aaaa", b"bbbb", b"cc", headers=headers) == [True] * 3
        accepted = _publish(ch, q, b"dddd")
        taken = []
        for more in (b"eeee", b"ffff"):
            m, _, body = ch.basic_get(q)  # its bytes leave the ready ones
            taken.append(body)
            accepted += _publish(ch, q, more)
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
    assert (accepted, taken, _bodies(broker, q), _deaths(broker, dead)) == want[key]


@pytest.mark.parametrize("overflow", ["drop-head", "reject-publish"])
def test_quorum_max_length_bytes(broker: Broker, queue_factory: Any, overflow: str) -> None:
    """A quorum queue's x-max-length-bytes 12, five 4-byte bodies without properties:
    RabbitMQ 3.x counts the bodies (4 bytes each), 4.x the properties too (6 bytes each:
    2 bytes of property flags). reject-publish accepts the publish that takes it over the
    limit, refuses after it, and takes publishes again once the ready bytes are down to
    80% of the limit (rabbit_fifo's soft limit)."""
    q, dead = queue_factory(), queue_factory("dead", declare=True)
    _declare(
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
        accepted = _publish(ch, q, b"1111", b"2222", b"3333", b"4444", b"5555")
        if overflow == "reject-publish":
            for _ in range(2):
                m, _, _ = ch.basic_get(q)
                ch.basic_ack(m.delivery_tag)
            accepted += _publish(ch, q, b"6666")
    finally:
        conn.close()
    bodies, deaths = _bodies(broker, q), [b for b, _ in _deaths(broker, dead)]
    if overflow == "drop-head":
        assert accepted == [True] * 5
        if v4:
            assert (bodies, deaths) == ([b"4444", b"5555"], [b"1111", b"2222", b"3333"])
        else:
            assert (bodies, deaths) == ([b"3333", b"4444", b"5555"], [b"1111", b"2222"])
    elif v4:  # 1, 2 fit (12); 3 takes it over (18); 1, 2 taken: 6 <= 9.6
        assert (accepted, bodies, deaths) == (
            [True] * 3 + [False] * 2 + [True],
            [b"3333", b"6666"],
            [],
        )
    else:  # 1, 2, 3 fit (12); 4 takes it over (16); 1, 2 taken: 8 <= 9.6
        assert (accepted, bodies, deaths) == (
            [True] * 4 + [False, True],
            [b"3333", b"4444", b"6666"],
            [],
        )


def test_reject_publish_dlx_refuses_and_dead_letters(broker: Broker, queue_factory: Any) -> None:
    """x-overflow reject-publish-dlx: the publish over the limit is nacked AND the
    refused message is dead-lettered (reason maxlen)."""
    q, dead = queue_factory(), queue_factory("dead", declare=True)
    _declare(
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
        assert _publish(ch, q, b"kept", b"refused") == [True, False]
    finally:
        conn.close()
    assert _bodies(broker, q) == [b"kept"]
    eventually(lambda: broker.counts(dead).ready == 1, what="the refused message dead-lettered")
    assert _deaths(broker, dead) == [(b"refused", "maxlen")]


@pytest.mark.parametrize("overflow", ["drop-head", "reject-publish"])
def test_a_requeue_over_the_limit(broker: Broker, queue_factory: Any, overflow: str) -> None:
    """A message requeued into a full queue comes back to its place (the head): a
    drop-head queue then drops from the head until it is within its limit again; a
    reject-publish queue keeps it (only publishes are refused), over its limit."""
    q, dead = queue_factory(), queue_factory("dead", declare=True)
    _declare(
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
        _publish(ch, q, b"1")
        m, _, _ = ch.basic_get(q)
        _publish(ch, q, b"2", b"3")
        ch.basic_nack(m.delivery_tag, requeue=True)
        broker.wait_for(q, unacked=0)
    finally:
        conn.close()
    if overflow == "drop-head":
        assert _bodies(broker, q) == [b"2", b"3"]
        assert _deaths(broker, dead) == [(b"1", "maxlen")]
    else:
        assert _bodies(broker, q) == [b"1", b"2", b"3"]
        assert _deaths(broker, dead) == []


# -- policies ----------------------------------------------------------------------------------


def test_a_policy_combines_with_the_queues_arguments(broker: Broker, queue_factory: Any) -> None:
    """An operator's policy max-length 1 / overflow drop-head on a queue declared with
    x-max-length 3 / x-overflow reject-publish: the lower limit applies (1) and the
    queue's own overflow (reject-publish). Cleared, the queue's own limit is back."""
    q = queue_factory()
    _declare(broker, q, **{"x-max-length": 3, "x-overflow": "reject-publish"})
    name = f"fidelity-{q}"
    pattern = f"^{re.escape(q)}$"
    broker.handle.set_policy(name, pattern, {"max-length": 1, "overflow": "drop-head"}, wait_for=q)
    conn = broker.handle.connect()
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        assert broker.handle.policy_of(q) == name
        assert _publish(ch, q, b"1", b"2") == [True, False]
        broker.handle.clear_policy(name, wait_for=q)
        assert _publish(ch, q, b"3", b"4", b"5") == [True, True, False]
    finally:
        conn.close()
        with contextlib.suppress(Exception):
            broker.handle.clear_policy(name)
    assert _bodies(broker, q) == [b"1", b"3", b"4"]


def test_a_policy_dead_letters_a_queue_that_has_no_dlx(broker: Broker, queue_factory: Any) -> None:
    """A policy can give a queue its dead-letter exchange and a message TTL: the
    message expires into the policy's dead-letter queue, reason expired."""
    q, dead = queue_factory(), queue_factory("dead", declare=True)
    _declare(broker, q)
    name = f"fidelity-{q}"
    definition = {"message-ttl": 50, "dead-letter-exchange": "", "dead-letter-routing-key": dead}
    broker.handle.set_policy(name, f"^{re.escape(q)}$", definition, priority=5, wait_for=q)
    try:
        conn = broker.handle.connect()
        try:
            ch = conn.channel()
            ch.confirm_delivery()
            _publish(ch, q, b"late")
        finally:
            conn.close()
        eventually(lambda: broker.counts(dead).ready == 1, timeout=5, what="dead-lettered")
    finally:
        broker.handle.clear_policy(name)
    assert broker.counts(q).ready == 0
    assert _deaths(broker, dead) == [(b"late", "expired")]


# -- re-declaring ------------------------------------------------------------------------------


def _redeclare(broker: Broker, name: str, args: dict[str, Any]) -> str:
    """'ok', or the reply code and the argument the broker names when it refuses."""
    conn = broker.handle.connect()
    try:
        conn.channel().queue_declare(name, durable=True, arguments=args)
        return "ok"
    except pika.exceptions.ChannelClosedByBroker as exc:
        named = re.search(r"inequivalent arg '([^']+)'", exc.reply_text)
        return f"{exc.reply_code} {named.group(1) if named else exc.reply_text}"
    finally:
        if conn.is_open:
            conn.close()


def test_redeclare_checks_only_the_arguments_rabbitmq_knows(
    broker: Broker, queue_factory: Any
) -> None:
    """A changed, added or missing custom argument passes; a changed, added or missing
    x-message-ttl, x-max-length or x-dead-letter-exchange is refused (406)."""
    q = queue_factory()
    base = {"x-custom": 1, "x-message-ttl": 60000, "x-queue-type": "classic"}
    _declare(broker, q, **base)
    assert _redeclare(broker, q, {**base, "x-custom": 2}) == "ok"
    assert _redeclare(broker, q, {**base, "x-other": "new"}) == "ok"
    assert _redeclare(broker, q, {"x-message-ttl": 60000}) == "ok"  # x-custom missing
    assert _redeclare(broker, q, {**base, "x-message-ttl": 1000}) == "406 x-message-ttl"
    assert _redeclare(broker, q, {"x-custom": 1}) == "406 x-message-ttl"
    assert _redeclare(broker, q, {**base, "x-max-length": 5}) == "406 x-max-length"
    assert _redeclare(broker, q, {**base, "x-dead-letter-exchange": ""}) == (
        "406 x-dead-letter-exchange"
    )


def test_redeclare_of_a_quorum_queue_checks_its_delivery_limit(
    broker: Broker, queue_factory: Any
) -> None:
    q = queue_factory()
    base = {"x-queue-type": "quorum", "x-delivery-limit": 5, "x-custom": "a"}
    _declare(broker, q, **base)
    assert _redeclare(broker, q, {**base, "x-custom": "b"}) == "ok"
    assert _redeclare(broker, q, {**base, "x-delivery-limit": 6}) == "406 x-delivery-limit"


# -- dead-letter cycles and TTL 0 --------------------------------------------------------------


def test_a_message_that_expires_into_its_own_queue_is_dropped(
    broker: Broker, queue_factory: Any
) -> None:
    """A queue that dead-letters expired messages to itself: the message comes back once
    (x-death names the queue), and on its next expiry RabbitMQ sees the cycle and drops it."""
    q = queue_factory()
    _declare(
        broker,
        q,
        **{"x-message-ttl": 100, "x-dead-letter-exchange": "", "x-dead-letter-routing-key": q},
    )
    conn = broker.handle.connect()
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        _publish(ch, q, b"loop")
    finally:
        conn.close()
    eventually(lambda: broker.counts(q).ready == 0, timeout=5, what="the cycle dropped")
    time.sleep(0.5)  # and it stays gone
    assert broker.counts(q).ready == 0


def test_a_two_queue_expiry_cycle_is_dropped(broker: Broker, queue_factory: Any) -> None:
    a, b = queue_factory("a"), queue_factory("b")
    for here, there in ((a, b), (b, a)):
        _declare(
            broker,
            here,
            **{
                "x-message-ttl": 100,
                "x-dead-letter-exchange": "",
                "x-dead-letter-routing-key": there,
            },
        )
    conn = broker.handle.connect()
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        _publish(ch, a, b"loop")
    finally:
        conn.close()

    def gone() -> bool:
        return broker.counts(a).ready == 0 and broker.counts(b).ready == 0

    eventually(gone, timeout=5, what="the cycle dropped")
    time.sleep(0.5)
    assert gone()


@pytest.mark.parametrize("ttl", ["expiration", "x-message-ttl"])
def test_a_ttl_of_0_reaches_a_waiting_consumer(
    runtime: Runtime, broker: Broker, queue_factory: Any, ttl: str
) -> None:
    """A message with TTL 0 is delivered when a consumer can take it at once; without a
    consumer it expires at once (dead-lettered)."""
    q, dead = queue_factory(), queue_factory("dead", declare=True)
    args: dict[str, Any] = {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dead}
    props: dict[str, Any] = {}
    if ttl == "x-message-ttl":
        args["x-message-ttl"] = 0
    else:
        props["expiration"] = "0"
    _declare(broker, q, **args)
    seen: list[bytes] = []

    async def handle(body: bytes, d: Delivery, io: IO) -> None:
        seen.append(body)

    app = runtime.app()
    runtime.listen(app, q, handle, payload=bytes, queue_arguments=args)
    conn = broker.handle.connect()
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        with runtime.running(app):
            broker.wait_for(q, consumers=1)
            _publish(ch, q, b"now", **props)
            eventually(lambda: seen == [b"now"], what="the TTL-0 message handled")
        broker.wait_for(q, consumers=0)
        _publish(ch, q, b"nobody", **props)
    finally:
        conn.close()
    eventually(lambda: broker.counts(dead).ready == 1, what="the unconsumed one dead-lettered")
    assert broker.counts(q).ready == 0
    assert _deaths(broker, dead) == [(b"nobody", "expired")]


# -- consumers: exclusive, and cancelled when their queue is deleted ------------------------------


class AioClient:
    """aiormq channels on the test's broker (real or in-memory), opened as AsyncApp opens them."""

    def __init__(self, url: str, lt: LoopThread) -> None:
        from ackkit._async import _amqp

        self.lt = lt
        self._conn, self.amqp = lt.run(
            _amqp.open_connection(url, heartbeat=None, name="contract-fidelity", timeout=10.0)
        )
        self.events: queues.Queue[tuple[str, Any]] = queues.Queue()

    def channel(self) -> Any:
        ch = self.lt.run(self.amqp.channel())
        ch.on_consumer_cancel_callbacks.add(lambda frame: self.events.put(("cancel", frame)))
        return ch

    def consume(self, ch: Any, queue: str, *, exclusive: bool = False) -> str:
        async def on_message(msg: Any) -> None:
            self.events.put(("message", msg.body))

        ok = self.lt.run(ch.basic_consume(queue, on_message, exclusive=exclusive))
        return str(ok.consumer_tag)

    def close_channel(self, ch: Any) -> None:
        self.lt.run(ch.close())

    def close(self) -> None:
        self.lt.run(self._conn.close())


class SelectClient:
    """pika SelectConnection channels on the test's broker, opened as App opens them; its
    I/O loop runs on a thread of its own."""

    def __init__(self, url: str) -> None:
        from ackkit._sync import _pika

        self.events: queues.Queue[tuple[str, Any]] = queues.Queue()
        opened: queues.Queue[Any] = queues.Queue()
        self.conn = _pika.select_connection(
            _pika.parameters(url, name="contract-fidelity"),
            on_open_callback=lambda c: opened.put(c),
            on_open_error_callback=lambda c, e: opened.put(e),
        )
        self.thread = threading.Thread(target=self.conn.ioloop.start, daemon=True)
        self.thread.start()
        got = opened.get(timeout=15)
        assert got is self.conn, got

    def _on_loop(self, fn: Callable[[queues.Queue[Any]], None], timeout: float = 10) -> Any:
        out: queues.Queue[Any] = queues.Queue()
        self.conn.ioloop.add_callback_threadsafe(lambda: fn(out))
        return out.get(timeout=timeout)

    def channel(self) -> Any:
        def open_(out: queues.Queue[Any]) -> None:
            def ready(ch: Any) -> None:
                ch.add_on_cancel_callback(lambda frame: self.events.put(("cancel", frame)))
                ch.add_on_close_callback(lambda c, reason: self.events.put(("closed", reason)))
                out.put(ch)

            self.conn.channel(on_open_callback=ready)

        return self._on_loop(open_)

    def consume(self, ch: Any, queue: str, *, exclusive: bool = False) -> str:
        """The consumer tag, or raises the ChannelClosedByBroker that refused it."""

        def go(out: queues.Queue[Any]) -> None:
            def on_message(_ch: Any, method: Any, _props: Any, body: bytes) -> None:
                self.events.put(("message", body))

            ch.add_on_close_callback(lambda c, reason: out.put(reason))
            ch.basic_consume(
                queue,
                on_message,
                exclusive=exclusive,
                callback=lambda frame: out.put(frame.method.consumer_tag),
            )

        got = self._on_loop(go)
        if isinstance(got, BaseException):
            raise got
        return str(got)

    def close_channel(self, ch: Any) -> None:
        def shut(out: queues.Queue[Any]) -> None:
            ch.close()
            out.put(None)

        self._on_loop(shut)

    def close(self) -> None:
        def shut(out: queues.Queue[Any]) -> None:
            if self.conn.is_open:
                self.conn.close()
            out.put(None)

        self._on_loop(shut)
        time.sleep(0.1)
        self.conn.ioloop.add_callback_threadsafe(self.conn.ioloop.stop)
        self.thread.join(10)
        self.conn.ioloop.close()  # pika's loop: its wake-up socket pair


@pytest.fixture(params=["pika", "aiormq"])
def client(request: pytest.FixtureRequest, broker: Broker) -> Iterator[Any]:
    """A consumer-side client of the broker: pika's SelectConnection (what App uses) or
    aiormq (what AsyncApp uses)."""
    if request.param == "pika":
        c: Any = SelectClient(broker.handle.url)
    else:
        c = AioClient(broker.handle.url, request.getfixturevalue("loop_thread"))
    yield c
    c.close()


def _refused(client: Any, ch: Any, queue: str, *, exclusive: bool) -> str:
    """How the broker refuses a consume: '<code> <text>'."""
    try:
        client.consume(ch, queue, exclusive=exclusive)
    except pika.exceptions.ChannelClosedByBroker as exc:
        return f"{exc.reply_code} {exc.reply_text}"
    except aiormq.exceptions.ChannelAccessRefused as exc:  # aiormq's name for a 403
        return f"403 {exc.args[0]}"
    raise AssertionError("the broker accepted the consume")


def test_an_exclusive_consumer_keeps_others_out(
    client: Any, broker: Broker, queue_factory: Any
) -> None:
    """basic.consume exclusive=True: another consume on the queue is refused (403,
    ACCESS_REFUSED ... in exclusive use) and closes that channel; an exclusive consume
    on a queue that has a consumer is refused the same way; once the exclusive consumer
    is gone, others may consume again."""
    q = queue_factory(declare=True)
    first = client.channel()
    client.consume(first, q, exclusive=True)
    want = f"403 ACCESS_REFUSED - queue '{q}' in vhost '/' in exclusive use"
    assert _refused(client, client.channel(), q, exclusive=False) == want
    assert _refused(client, client.channel(), q, exclusive=True) == want
    assert broker.counts(q).consumers == 1
    assert broker.take_all(q) == []  # basic.get is no consume: not refused

    other = queue_factory(declare=True)
    client.consume(client.channel(), other)
    assert _refused(client, client.channel(), other, exclusive=True) == (
        f"403 ACCESS_REFUSED - queue '{other}' in vhost '/' in exclusive use"
    )
    client.close_channel(first)
    broker.wait_for(q, consumers=0)
    client.consume(client.channel(), q)  # free again
    broker.wait_for(q, consumers=1)


def test_deleting_a_queue_cancels_its_consumers(
    client: Any, broker: Broker, queue_factory: Any
) -> None:
    """queue.delete sends each consumer basic.cancel (pika and aiormq announce
    consumer_cancel_notify); the channel stays open."""
    q = queue_factory(declare=True)
    ch = client.channel()
    tag = client.consume(ch, q)
    broker.wait_for(q, consumers=1)
    broker.handle.delete(q)
    kind, frame = client.events.get(timeout=10)
    assert kind == "cancel"
    method = getattr(frame, "method", frame)  # pika: a frame; aiormq: the method
    assert method.consumer_tag == tag
    time.sleep(0.2)
    assert client.events.empty()  # no close followed
    assert not ch.is_closed
