"""The Spark source settles through the same pika executor and confirm publisher as the
App: a copy the broker returns or refuses ends the same way for both (what the broker
shows: the dead-letter queue's contents and reasons, the source queue emptied)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from ackkit import App
from tests.contract.conftest import Broker

pytestmark = [pytest.mark.integration]


class Order(BaseModel):
    id: int


@contextmanager
def app_source(url: str, q: str, tmp: Path) -> Iterator[None]:
    app = App(url)

    @app.listener(q, ack_mode="auto")
    def handle(order: Order) -> None:
        raise AssertionError("no valid message is published")

    with app.running():
        yield


@contextmanager
def spark_source(url: str, q: str, tmp: Path) -> Iterator[None]:
    pytest.importorskip("pyspark")
    from ackkit.spark import SourceOptions
    from ackkit.spark._consumer import SourceConsumer

    opts = SourceOptions.parse(
        {"url": url, "queue": q, "checkpoint": str(tmp), "on_invalid": "dead_letter"}
    )
    c = SourceConsumer(opts, Order)
    c.start()
    try:
        assert c.wait_ready(30)
        yield
    finally:
        c.stop()


SOURCES: dict[str, Callable[[str, str, Path], Any]] = {"app": app_source, "spark": spark_source}
bad_bodies = st.lists(st.sampled_from([b"not json", b"{}", b'{"id": "x"}', b"[]"]), min_size=1)


@pytest.mark.parametrize("source", sorted(SOURCES))
@settings(
    max_examples=3,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(bodies=bad_bodies)
def test_a_returned_dead_letter_is_published_again_after_the_queue_is_declared(
    source: str,
    broker: Broker,
    amqp_url: str,
    queue_factory: Any,
    tmp_path_factory: Any,
    bodies: list[bytes],
) -> None:
    q = queue_factory(declare=True)
    with SOURCES[source](amqp_url, q, tmp_path_factory.mktemp("ckpt")):
        broker.handle.delete(f"{q}.dlq")  # the copies come back unroutable
        broker.publish(q, list(bodies))
        broker.wait_for(f"{q}.dlq", ready=len(bodies))
        broker.wait_for(q, ready=0, unacked=0)
    dead = broker.take_all(f"{q}.dlq")
    assert sorted(m.body for m in dead) == sorted(bodies)
    assert all(m.headers.get("ackkit-reason") for m in dead)
