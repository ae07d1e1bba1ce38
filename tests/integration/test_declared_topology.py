"""`app.declare(...)`: exchanges, and queues no listener consumes with their bindings,
declared at start and again after a reconnect, on App and AsyncApp, on a real broker."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from _apps import Runner
from _retry_support import channel, wait_until
from test_bindings import bindings, exchange_types, pub

from ackkit import App, AsyncApp, Queue
from ackkit.errors import TopologyConflict
from ackkit.topology import Exchange, ExchangeType

pytestmark = [pytest.mark.integration, pytest.mark.one_leg]


@pytest.fixture
def exchange(rabbitmq: Any) -> Iterator[str]:
    name = f"t.ex.declared.{uuid.uuid4().hex[:8]}"
    yield name
    with channel(rabbitmq.url) as ch, contextlib.suppress(Exception):
        ch.exchange_delete(name)


def _app(kind: str, url: str, work: str) -> App | AsyncApp:
    app: App | AsyncApp = App(url) if kind == "sync" else AsyncApp(url)
    if isinstance(app, App):

        @app.listener(work)
        def handle(body: bytes) -> None: ...
    else:

        @app.listener(work)
        async def ahandle(body: bytes) -> None: ...

    return app


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_declared_exchange_and_bound_queue_exist_at_start_and_again_after_a_reconnect(
    kind: str, rabbitmq: Any, queue_factory: Any, exchange: str
) -> None:
    work, audit = queue_factory("work"), queue_factory("audit")
    app = _app(kind, rabbitmq.url, work)
    app.declare(
        Exchange(exchange, ExchangeType.DIRECT),
        Queue(audit, arguments={"x-max-length": 100}, bind=(exchange, "order.created")),
    )
    r = Runner(app)
    r.start()
    try:
        assert exchange_types(rabbitmq)[exchange] == "direct"
        assert bindings(rabbitmq, audit) == {("", audit), (exchange, "order.created")}
        pub(r, "order.created", {"n": 1}, exchange=exchange)  # no listener consumes audit
        assert wait_until(lambda: rabbitmq.counts(audit).ready == 1, 30)

        # Deleted by an operator meanwhile: the next connection declares them again.
        with channel(rabbitmq.url) as ch:
            ch.exchange_delete(exchange)
            ch.queue_delete(audit)
        assert exchange not in exchange_types(rabbitmq)
        rabbitmq.close_connections("test: the app reconnects")
        assert wait_until(lambda: exchange in exchange_types(rabbitmq), 60)
        assert wait_until(lambda: (exchange, "order.created") in bindings(rabbitmq, audit), 30)
        assert wait_until(lambda: r.alive() and rabbitmq.counts(work).consumers == 1, 60)
        pub(r, "order.created", {"n": 2}, exchange=exchange)
        assert wait_until(lambda: rabbitmq.counts(audit).ready == 1, 30)
    finally:
        r.stop()


def test_a_declared_queue_that_must_exist_and_does_not_stops_the_start(
    rabbitmq: Any, queue_factory: Any
) -> None:
    work, missing = queue_factory("work"), queue_factory("missing")
    app = _app("sync", rabbitmq.url, work)
    app.declare(Queue(missing, declare=False))
    with pytest.raises(TopologyConflict, match=f"queue '{missing}' does not exist"):
        app.start()
