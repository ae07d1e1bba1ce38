"""Publishing from an App / AsyncApp and from handlers, on a real broker.

Every test reads back what the broker holds (the message and its properties,
queue counts, the dead-letter queue), not what the publisher said.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from _apps import Runner, proxied
from _retry_support import channel, drain, header_text, publish, wait_until
from pydantic import BaseModel

from ackkit import App, AsyncApp, AsyncDelivery, Delivery
from ackkit._core import headers as H
from ackkit.errors import MessageUnroutable, PublishNacked, PublishNotConfirmed

pytestmark = [pytest.mark.integration, pytest.mark.one_leg]

KINDS = ["sync", "async"]


class Order(BaseModel):
    id: int
    amount: float


def make(kind: str, url: str) -> App | AsyncApp:
    return App(url) if kind == "sync" else AsyncApp(url)


def pub(r: Runner, *args: Any, **kw: Any) -> None:
    """app.publish(...) from a test thread, for either kind of app."""
    if isinstance(r.app, App):
        r.app.publish(*args, **kw)
        return
    assert r.loop is not None
    asyncio.run_coroutine_threadsafe(r.app.publish(*args, **kw), r.loop).result(60)


@pytest.fixture
def idle(queue_factory: Any) -> Iterator[str]:
    """A queue that only keeps the app running (listeners need one)."""
    yield queue_factory("idle", declare=True)


def running(kind: str, url: str, idle: str) -> Runner:
    app = make(kind, url)
    if isinstance(app, App):

        @app.listener(idle)
        def _idle(body: bytes) -> None: ...
    else:

        @app.listener(idle)
        async def _aidle(body: bytes) -> None: ...

    r = Runner(app)
    r.start()
    return r


@pytest.mark.parametrize("kind", KINDS)
def test_a_model_is_published_as_json_with_its_properties(
    kind: str, rabbitmq: Any, queue_factory: Any, idle: str
) -> None:
    q = queue_factory("out", declare=True)
    r = running(kind, rabbitmq.url, idle)
    try:
        pub(
            r,
            q,
            Order(id=7, amount=1.5),
            headers={"tenant": "acme", "n": 3},
            correlation_id="c-7",
            reply_to="replies",
            priority=4,
            app_id="orders-svc",
            expiration="60000",
        )
        pub(r, q, b"\x00raw", message_id="raw-1", persistent=False)
        pub(r, q, "plain text")
        pub(r, q, {"k": [1, 2]}, content_type="application/vnd.x+json")
    finally:
        r.stop()
    msgs = drain(rabbitmq.url, q)
    assert len(msgs) == 4
    (p1, b1), (p2, b2), (p3, b3), (p4, b4) = msgs
    assert json.loads(b1) == {"id": 7, "amount": 1.5}
    assert p1.content_type == "application/json"
    assert p1.delivery_mode == 2
    assert p1.message_id and len(p1.message_id) == 32  # made for us
    assert p1.correlation_id == "c-7"
    assert p1.reply_to == "replies"
    assert p1.priority == 4
    assert p1.app_id == "orders-svc"
    assert p1.expiration == "60000"
    assert {k: header_text(v) for k, v in p1.headers.items()} == {"tenant": "acme", "n": 3}
    assert b2 == b"\x00raw" and p2.content_type is None and p2.delivery_mode == 1
    assert p2.message_id == "raw-1"
    assert b3 == b"plain text" and p3.content_type is None
    assert json.loads(b4) == {"k": [1, 2]} and p4.content_type == "application/vnd.x+json"


@pytest.mark.parametrize("kind", KINDS)
def test_unroutable_and_refused_publishes_raise_and_store_nothing(
    kind: str, rabbitmq: Any, queue_factory: Any, idle: str
) -> None:
    missing = queue_factory("missing")  # never declared
    full = queue_factory("full")
    with channel(rabbitmq.url) as ch:
        ch.queue_declare(
            full, durable=True, arguments={"x-max-length": 1, "x-overflow": "reject-publish"}
        )
    publish(rabbitmq.url, full, b"first")
    r = running(kind, rabbitmq.url, idle)
    try:
        with pytest.raises(MessageUnroutable, match="no queue is bound"):
            pub(r, missing, {"a": 1})
        with pytest.raises(MessageUnroutable):
            pub(r, "x", {"a": 1}, exchange="amq.topic")  # an exchange with no binding for it
        pub(r, missing, {"a": 1}, mandatory=False)  # dropped by the broker, as asked
        with pytest.raises(PublishNacked, match="refused"):
            pub(r, full, b"second")
        pub(r, idle, b"still publishing after the failures")
        assert wait_until(lambda: rabbitmq.counts(idle).total == 0, 30)  # the listener took it
    finally:
        r.stop()
    assert [b for _, b in drain(rabbitmq.url, full)] == [b"first"]


def test_publish_needs_a_running_app(rabbitmq: Any) -> None:
    app = App(rabbitmq.url)
    with pytest.raises(RuntimeError, match="needs the app running"):
        app.publish("q", b"x")


def test_bad_options_fail_at_the_call(rabbitmq: Any, idle: str) -> None:
    r = running("sync", rabbitmq.url, idle)
    try:
        with pytest.raises(TypeError, match="unknown publish option"):
            pub(r, "q", b"x", priorty=3)
        with pytest.raises(TypeError, match="body must be"):
            pub(r, "q", object())
        with pytest.raises(ValueError, match="finite"):
            pub(r, "q", b"x", headers={"f": float("nan")})
        with pytest.raises(ValueError, match="255"):
            pub(r, "q" * 256, b"x")
    finally:
        r.stop()


@pytest.mark.parametrize("kind", KINDS)
def test_handlers_publish_a_result_and_reply_to_the_sender(
    kind: str, rabbitmq: Any, queue_factory: Any
) -> None:
    """A handler publishes its result (confirmed before its delivery is acked) and
    replies to reply_to with the request's correlation_id."""
    requests = queue_factory("req")
    results = queue_factory("res", declare=True)
    replies = queue_factory("rep", declare=True)
    app = make(kind, rabbitmq.url)
    if isinstance(app, App):

        @app.listener(requests)
        def handle(order: Order, d: Delivery) -> None:
            app.publish(results, {"order": order.id, "total": order.amount * 2})
            d.reply({"ok": order.id})

    else:

        @app.listener(requests)
        async def ahandle(order: Order, d: AsyncDelivery) -> None:
            await app.publish(results, {"order": order.id, "total": order.amount * 2})
            await d.reply({"ok": order.id})

    r = Runner(app)
    r.start()
    try:
        for i in range(5):
            publish(
                rabbitmq.url,
                requests,
                json.dumps({"id": i, "amount": 1.0}),
                reply_to=replies,
                correlation_id=f"corr-{i}",
            )
        assert wait_until(lambda: rabbitmq.counts(replies).ready == 5, 30)
        assert wait_until(lambda: rabbitmq.counts(requests).total == 0, 30)
    finally:
        r.stop()
    got = drain(rabbitmq.url, replies)
    assert sorted((p.correlation_id, json.loads(b)["ok"]) for p, b in got) == [
        (f"corr-{i}", i) for i in range(5)
    ]
    res = sorted(json.loads(b)["order"] for _, b in drain(rabbitmq.url, results))
    assert res == list(range(5))


def test_a_def_handler_on_async_app_publishes_through_its_delivery(
    rabbitmq: Any, queue_factory: Any
) -> None:
    requests = queue_factory("req")
    results = queue_factory("res", declare=True)
    app = AsyncApp(rabbitmq.url)

    @app.listener(requests)
    def handle(body: dict[str, Any], d: Delivery) -> None:  # runs in the thread pool
        d.publish(results, {"seen": body["n"]}, headers={"from": "def-handler"})

    r = Runner(app)
    r.start()
    try:
        publish(rabbitmq.url, requests, json.dumps({"n": 1}))
        assert wait_until(lambda: rabbitmq.counts(results).ready == 1, 30)
    finally:
        r.stop()
    [(p, b)] = drain(rabbitmq.url, results)
    assert json.loads(b) == {"seen": 1} and header_text(p.headers["from"]) == "def-handler"


@pytest.mark.parametrize("kind", KINDS)
def test_a_publish_that_fails_in_a_handler_dead_letters_with_the_public_error_name(
    kind: str, rabbitmq: Any, queue_factory: Any
) -> None:
    requests = queue_factory("req")
    requests2 = queue_factory("req2")
    nowhere = queue_factory("nowhere")  # never declared
    app = make(kind, rabbitmq.url)
    if isinstance(app, App):

        @app.listener(requests)
        def handle(d: Delivery) -> None:
            d.reply(b"answer")  # no reply_to: ValueError

        @app.listener(requests2, name="second")
        def handle2(body: bytes) -> None:
            app.publish(nowhere, body)

    else:

        @app.listener(requests)
        async def ahandle(d: AsyncDelivery) -> None:
            await d.reply(b"answer")

        @app.listener(requests2, name="second")
        async def ahandle2(body: bytes) -> None:
            await app.publish(nowhere, body)

    r = Runner(app)
    r.start()
    try:
        publish(rabbitmq.url, requests, b"{}")
        publish(rabbitmq.url, requests2, b"{}")
        assert wait_until(lambda: rabbitmq.counts(requests2 + ".dlq").ready == 1, 30)
        assert wait_until(lambda: rabbitmq.counts(requests + ".dlq").ready == 1, 30)
    finally:
        r.stop()
    [(p1, _)] = drain(rabbitmq.url, requests + ".dlq")
    assert header_text(p1.headers[H.ERROR_TYPE]) == "ValueError"
    assert "no reply_to" in header_text(p1.headers[H.ERROR_MESSAGE])
    [(p2, _)] = drain(rabbitmq.url, requests2 + ".dlq")
    assert header_text(p2.headers[H.ERROR_TYPE]) == "ackkit.MessageUnroutable"


def test_a_publish_while_the_connection_is_down_is_never_sent_once_it_timed_out(
    rabbitmq: Any, queue_factory: Any, idle: str
) -> None:
    """PublishNotConfirmed "not published" is a promise: the message is withdrawn, and
    does not appear once the connection is back. "no confirm" is the other case: sent,
    its confirm never came (held back here), and the broker may well have it."""
    out = queue_factory("out", declare=True)
    proxy, url = proxied(rabbitmq.url)
    upstream = proxy.upstream
    app = App(url, reconnect_max_interval=0.5)

    @app.listener(idle)
    def _idle(body: bytes) -> None: ...

    try:
        app.start()
        proxy.upstream = ("127.0.0.1", 1)  # new connections fail from now on
        proxy.cut()
        assert wait_until(lambda: not _connected(app), 30)
        with pytest.raises(PublishNotConfirmed, match="not published"):
            app.publish(out, b"withdrawn", timeout=1.0)
        proxy.upstream = upstream
        assert wait_until(lambda: _connected(app), 30)
        proxy.hold()  # the broker's answers no longer reach the app
        with pytest.raises(PublishNotConfirmed, match="no confirm within"):
            app.publish(out, b"unconfirmed", timeout=1.0)
        proxy.release()
        app.publish(out, b"after")
    finally:
        app.stop()
        proxy.close()
    assert [b for _, b in drain(rabbitmq.url, out)] == [b"unconfirmed", b"after"]


def _connected(app: App) -> bool:
    rt: Any = app._runtime
    ch = rt.publisher.channel if rt else None
    return ch is not None and ch.is_open


def test_many_threads_publish_at_once(rabbitmq: Any, queue_factory: Any, idle: str) -> None:
    out = queue_factory("out", declare=True)
    r = running("sync", rabbitmq.url, idle)
    errors: list[BaseException] = []

    def work(t: int) -> None:
        try:
            for i in range(50):
                pub(r, out, {"t": t, "i": i})
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(120)
    r.stop()
    assert not errors
    got = {(m["t"], m["i"]) for m in (json.loads(b) for _, b in drain(rabbitmq.url, out))}
    assert got == {(t, i) for t in range(4) for i in range(50)}


def test_pull_connections_publish_with_the_same_options_and_errors(
    rabbitmq: Any, queue_factory: Any
) -> None:
    import ackkit

    q = queue_factory("pull", declare=True)
    missing = queue_factory("missing")
    with ackkit.connect(rabbitmq.url) as conn:
        conn.publish(q, Order(id=1, amount=2.0), correlation_id="c", priority=1)
        with pytest.raises(MessageUnroutable):
            conn.publish(missing, b"x")
        with pytest.raises(TypeError, match="unknown publish option"):
            conn.publish(q, b"x", colour="red")
    [(p, b)] = drain(rabbitmq.url, q)
    assert json.loads(b) == {"id": 1, "amount": 2.0}
    assert (p.correlation_id, p.priority, p.content_type) == ("c", 1, "application/json")
