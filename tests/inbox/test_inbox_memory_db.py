"""`delivery.db` on the in-memory inbox (``Inbox("memory://...")``), which has no
database: the documented handler (``delivery.db.execute(...)``) failed with "'NoneType'
object has no attribute 'execute'". It is now a stand-in that is false and raises an
error naming the fix (PostgreSQL with the ``postgres_dsn`` fixture); ``delivery.publish``
still publishes at once, and outside the handler ``db`` is None. App and AsyncApp, on
the test kit's in-memory broker."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Iterator
from typing import Any

import pytest

from ackkit import App, AsyncApp, AsyncDelivery, Delivery
from ackkit.inbox import Inbox, memory_inbox
from ackkit.inbox._memory import NoDatabaseError


@pytest.fixture
def inbox() -> Iterator[Inbox]:
    name = f"memory://db-{secrets.token_hex(4)}"
    yield Inbox(name)
    memory_inbox(name).clear()


def check_db(d: Any, seen: dict[str, Any]) -> None:
    seen["truth"] = bool(d.db)
    seen["is_none"] = d.db is None
    with pytest.raises(NoDatabaseError) as info:
        d.db.execute("INSERT INTO shipments (order_id) VALUES (%s)", (1,))
    seen["error"] = str(info.value)
    with pytest.raises(NoDatabaseError), d.db.transaction():
        pass
    seen["delivery"] = d


def assert_seen(seen: dict[str, Any], inbox: Inbox) -> None:
    assert seen["truth"] is False and seen["is_none"] is False
    text = seen["error"]
    assert "delivery.db.execute" in text and repr(inbox.dsn) in text
    assert "in-memory inbox" in text and "postgres_dsn" in text
    assert seen["delivery"].db is None  # outside the handler, as on PostgreSQL


def test_app_delivery_db_on_the_memory_inbox_says_what_to_use(
    memory_broker: Any, queue_factory: Any, inbox: Inbox
) -> None:
    queue = queue_factory(broker=memory_broker)
    out = queue_factory("out", broker=memory_broker, declare=True)
    app = App(memory_broker.url)
    seen: dict[str, Any] = {}

    @app.listener(queue, inbox=inbox)
    def handle(body: bytes, delivery: Delivery) -> None:
        check_db(delivery, seen)
        delivery.publish(out, b"sent")  # no outbox: published at once

    with app.running():
        memory_broker.publish(queue, b"x", message_id="m-1")
        memory_broker.wait_for(queue, ready=0, unacked=0)
        memory_broker.wait_for(out, ready=1)
    assert memory_broker.dead_letters(queue) == []
    assert_seen(seen, inbox)


def test_async_app_delivery_db_on_the_memory_inbox_says_what_to_use(
    memory_broker: Any, queue_factory: Any, inbox: Inbox
) -> None:
    queue = queue_factory(broker=memory_broker)
    out = queue_factory("out", broker=memory_broker, declare=True)
    app = AsyncApp(memory_broker.url)
    seen: dict[str, Any] = {}

    @app.listener(queue, inbox=inbox)
    async def handle(body: bytes, delivery: AsyncDelivery) -> None:
        check_db(delivery, seen)
        with pytest.raises(NoDatabaseError, match="postgres_dsn"):
            async with delivery.db.transaction():
                pass
        await delivery.publish(out, b"sent")

    async def main() -> None:
        async with app.running():
            memory_broker.publish(queue, b"x", message_id="m-1")
            await memory_broker.wait_for_async(queue, ready=0, unacked=0)
            await memory_broker.wait_for_async(out, ready=1)

    asyncio.run(main())
    assert memory_broker.dead_letters(queue) == []
    assert_seen(seen, inbox)


def test_a_listener_without_an_inbox_keeps_db_none(memory_broker: Any, queue_factory: Any) -> None:
    queue = queue_factory(broker=memory_broker)
    app = App(memory_broker.url)
    seen: list[Any] = []

    @app.listener(queue)
    def handle(body: bytes, delivery: Delivery) -> None:
        seen.append(delivery.db)

    with app.running():
        memory_broker.publish(queue, b"x")
        memory_broker.wait_for(queue, ready=0, unacked=0)
    assert seen == [None]
