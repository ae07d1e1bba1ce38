"""The in-memory broker does what RabbitMQ does with exclusive consumers and with the
consumers of a deleted queue: each case runs on a real node and on the in-memory broker
(under 3.13's and 4.3's rules), through the clients the runtimes use: pika's
SelectConnection (`App`) and aiormq (`AsyncApp`), each opened by ackkit's own connection
functions, so a real node and the in-memory broker get the same calls."""

from __future__ import annotations

import queue as queues
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import aiormq.exceptions
import pika.exceptions
import pytest

from .conftest import Broker, LoopThread
from .fidelity import transport

pytestmark = pytest.mark.contract
__all__ = ["transport"]  # every case runs on the in-memory broker under 4.3's rules too


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
