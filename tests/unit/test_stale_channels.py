"""Nothing of a closed channel is carried out later, without a broker: a copy of its
delivery is not published, its delivery does not start, its tags are not settled
on a dead connection."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from ackkit import AckMode, App, Delivery
from ackkit._core.actions import Republish
from ackkit.observability import Stage
from tests.unit._fakes import RETRY3, Broker, FakeChannel, core


def test_copy_of_a_delivery_from_a_closed_channel_is_not_publishable() -> None:
    """A retry copy decided before a connection loss and published after it was a second
    lineage next to the broker's redelivery of the original (over-attempts, DLQ twins)."""
    c = core(retry=RETRY3)
    t = c.receive(1)
    [a] = c.finish(t, ValueError("x"))
    assert isinstance(a, Republish) and c.publishable(a.token)
    c.channel_closed()
    assert not c.publishable(a.token)
    c.channel_opened()
    assert not c.publishable(a.token)
    assert c.republished(a.token, False) == []  # no requeue of a stale tag either
    assert not c.publishable(a.token)  # forgotten


def test_no_ack_copy_is_always_publishable() -> None:
    c = core(mode=AckMode.NONE)
    t = c.receive(1)
    [a] = c.finish(t, ValueError("x"))
    c.channel_closed()
    assert c.publishable(a.token)  # the broker forgot the original: the copy is all there is


def test_sync_publisher_drops_a_waiting_copy_of_a_closed_channel() -> None:
    """Copies waiting for the publisher channel are dropped if their delivery's channel
    closed meanwhile (they used to be published on the next connection: duplicates)."""
    from ackkit._sync.consumer import Consumer
    from ackkit._sync.publisher import Publisher

    app = App("amqp://guest:guest@localhost:1/%2f")

    @app.listener("q", retry=RETRY3)
    def handle(d: Delivery) -> None:
        raise ValueError("x")

    rt: Any = SimpleNamespace(
        app=app, connection=SimpleNamespace(is_open=True), stopping=False, call_soon=lambda f: f()
    )
    rt.publisher = pub = Publisher(rt)
    c = Consumer(rt, app.specs[0], None)
    c.channel = FakeChannel(Broker(range(1, 2)))
    c.core.channel_opened()
    t = c.core.receive(1)
    [a] = c.core.finish(t, ValueError("x"))
    assert isinstance(a, Republish)
    pub.publish(c, c.core.generation, a)  # no publisher channel yet: waits
    assert len(pub.waiting) == 1
    c.core.channel_closed()
    c.core.channel_opened()
    sent: list[Any] = []
    ch = SimpleNamespace(is_open=True, basic_publish=lambda *args, **kw: sent.append(args))
    pub._ready(ch)
    assert sent == [] and pub.pending == {}


def test_sync_publisher_closing_with_its_connection_does_not_settle_stale_tags() -> None:
    """pika closes a connection's channels in number order, the publisher's first: the
    unconfirmed copies were reported before the consumers' channels were marked closed,
    and the requeue of their originals went to a dead connection (ConnectionWrongStateError
    in the I/O thread: the consumer process exited on every connection cut)."""
    from ackkit._sync.consumer import Consumer
    from ackkit._sync.publisher import Publisher

    app = App("amqp://guest:guest@localhost:1/%2f")

    @app.listener("q", retry=RETRY3)
    def handle(d: Delivery) -> None: ...

    conn = SimpleNamespace(is_open=True, ioloop=SimpleNamespace(call_later=lambda *a: None))
    rt: Any = SimpleNamespace(app=app, connection=conn, stopping=False, call_soon=lambda f: f())
    rt.publisher = pub = Publisher(rt)
    c = Consumer(rt, app.specs[0], None)
    rt.consumers = [c]

    def channels_lost(reason: BaseException) -> None:
        for x in rt.consumers:
            if x.channel is not None:
                x._on_channel_closed(x.channel, reason)

    rt.channels_lost = channels_lost

    class DeadChannel(FakeChannel):
        def basic_reject(self, tag: int, requeue: bool = False) -> None:
            raise AssertionError("a frame on a closed connection")

    c.channel = DeadChannel(Broker(range(1, 2)))
    c.core.channel_opened()
    t = c.core.receive(1)
    d = Delivery(b"{}", SimpleNamespace(headers=None, message_id="m1"), t, c)
    c.originals.put(t.generation, t.tag, d)  # what the consumer does on a delivery
    [a] = c.core.finish(t, ValueError("x"))
    c.originals.decided(c.core.generation, [a])  # what it does with the core's decisions
    pub.channel = SimpleNamespace(is_open=True, basic_publish=lambda *args, **kw: None)
    pub.publish(c, c.core.generation, a)
    assert len(pub.pending) == 1
    conn.is_open = False  # the connection is going down
    pub._on_closed(pub.channel, ConnectionError("cut"))
    assert c.channel is None and not c.core.open
    assert pub.pending == {}


def test_a_delivery_of_a_closed_channel_does_not_start() -> None:
    """The broker requeued it with its channel: running the handler now only duplicated
    the work its redelivery does (the pika runtime ran its whole inbox after every cut)."""
    c = core(retry=RETRY3)
    t = c.receive(1)
    assert c.shutdown.startable(t)
    c.channel_closed()
    c.channel_opened()
    assert not c.shutdown.startable(t) and t.settled
    assert c.counters.counts[Stage.DROPPED_STALE] == 1
    n = core(mode=AckMode.NONE)
    u = n.receive(1)
    n.channel_closed()
    assert n.shutdown.startable(u)  # no-ack: the broker forgot it, this is the only chance


def test_sync_worker_skips_deliveries_of_a_closed_channel() -> None:
    from ackkit._sync.consumer import Consumer

    app = App("amqp://guest:guest@localhost:1/%2f")
    ran: list[int] = []

    @app.listener("q")
    def handle(d: Delivery) -> None:
        ran.append(d.delivery_tag)

    loop = SimpleNamespace(call_later=lambda _s, _fn: None)  # the hand-over is by hand
    rt = SimpleNamespace(
        app=app,
        connection=SimpleNamespace(is_open=True, ioloop=loop),
        stopping=False,
        call_soon=lambda fn: None,
    )
    c = Consumer(rt, app.specs[0], None)  # type: ignore[arg-type]
    ch = FakeChannel(Broker(range(1, 3)))
    c.channel = ch
    c.core.channel_opened()
    for tag in (1, 2):
        method = SimpleNamespace(delivery_tag=tag, redelivered=False, exchange="", routing_key="q")
        c._on_message(ch, method, SimpleNamespace(headers=None, message_id=None), b"{}")
    c.core.channel_closed()  # both still in the inbox
    c.inbox.hand_over()  # as a closing channel does
    c.core.channel_opened()
    c.inbox.close(1)
    c._worker()
    assert ran == []
    assert c.core.counters.counts[Stage.DROPPED_STALE] == 2
