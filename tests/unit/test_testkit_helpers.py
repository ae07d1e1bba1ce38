"""The test kit's helpers on the in-memory broker (no network): publish, read a queue and
a dead-letter queue, wait blocking or with await. tests/service runs them on a real
broker as well."""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Iterator
from typing import Any

import pytest
from pydantic import BaseModel

from ackkit.testing import InMemoryBroker, NotRouted, wait_until, wait_until_async


class Item(BaseModel):
    id: int
    name: str


@pytest.fixture
def broker() -> Iterator[InMemoryBroker]:
    with InMemoryBroker() as b:
        with b.connect() as conn:
            conn.channel().queue_declare("q", durable=True)
            conn.channel().queue_declare("q.dlq", durable=True)
        yield b


def test_publish_encodes_models_json_text_and_bytes(broker: InMemoryBroker) -> None:
    broker.publish("q", Item(id=1, name="a"))
    broker.publish("q", [1, 2])
    broker.publish("q", "plain")
    broker.publish(
        "q",
        b"\x00raw",
        content_type="application/octet-stream",
        correlation_id="c-1",
        reply_to="replies",
        priority=3,
        headers={"ratio": 0.25, "n": 7, "when": dt.datetime(2026, 1, 2, tzinfo=dt.UTC)},
    )
    model, lst, text, raw = broker.messages("q", take=True)
    assert model.model(Item) == Item(id=1, name="a")
    assert model.properties["content_type"] == "application/json"
    assert lst.json() == [1, 2]
    # str is sent as it is, without a content type, as every publish front sends it
    assert text.text() == "plain" and "content_type" not in text.properties
    assert len(text.properties["message_id"]) == 32  # a new one, as App.publish makes
    assert raw.body == b"\x00raw"
    assert raw.properties["correlation_id"] == "c-1" and raw.properties["reply_to"] == "replies"
    assert raw.properties["priority"] == 3 and raw.properties["delivery_mode"] == 2
    assert raw.headers["n"] == 7 and raw.headers["when"].year == 2026
    assert "ratio" in raw.headers  # a float header is sent (pika alone cannot encode one)
    assert broker.counts("q").total == 0


def test_publishing_where_no_queue_listens_fails_at_once(broker: InMemoryBroker) -> None:
    with pytest.raises(NotRouted, match="'nobody'"):
        broker.publish("nobody", {"id": 1})
    broker.publish("nobody", {"id": 1}, mandatory=False)  # dropped, as asked


def test_an_unknown_property_is_a_type_error(broker: InMemoryBroker) -> None:
    with pytest.raises(TypeError, match="contnet_type"):
        broker.publish("q", b"x", contnet_type="text/plain")


def test_messages_peeks_and_take_removes(broker: InMemoryBroker) -> None:
    broker.publish_many("q", [{"n": i} for i in range(3)])
    assert [m.json()["n"] for m in broker.messages("q")] == [0, 1, 2]
    assert broker.counts("q").ready == 3
    assert [m.json()["n"] for m in broker.messages("q", take=True)] == [0, 1, 2]
    assert broker.counts("q").total == 0


def test_dead_letters_are_read_with_their_reason(broker: InMemoryBroker) -> None:
    broker.publish(
        "q.dlq",
        {"id": 9},
        headers={
            "ackkit-reason": "attempts exhausted (3 of 3)",
            "ackkit-error-type": "ValueError",
            "ackkit-attempts": 3,
            "ackkit-original-queue": "q",
        },
    )
    broker.publish("q.dlq", b"from elsewhere")
    ours, foreign = broker.dead_letters("q.dlq")
    assert ours.reason == "attempts exhausted (3 of 3)"
    assert ours.dead_letter is not None
    assert ours.dead_letter.source == "ackkit"
    assert (ours.dead_letter.error_type, ours.dead_letter.attempts) == ("ValueError", 3)
    assert ours.dead_letter.original_queue == "q" and ours.json() == {"id": 9}
    assert foreign.dead_letter is not None and foreign.dead_letter.source == "unknown"
    assert broker.counts("q.dlq").ready == 2  # read, not taken


def test_waits_report_what_they_last_saw(broker: InMemoryBroker) -> None:
    broker.publish("q", b"x")
    with pytest.raises(AssertionError, match=r"ready=1"):
        broker.wait_for("q", ready=0, timeout=0.2)

    async def main() -> None:
        await broker.wait_for_async("q", ready=1)
        with pytest.raises(AssertionError, match=r"did not reach \{'ready': 0\}.*ready=1"):
            await broker.wait_for_async("q", ready=0, timeout=0.2)
        with pytest.raises(AssertionError, match="does not exist"):
            await broker.wait_for_async("missing", ready=0, timeout=0.1)

    asyncio.run(main())


def test_wait_until_takes_plain_and_async_checks() -> None:
    calls = []

    def check() -> bool:
        calls.append(1)
        return len(calls) >= 3

    wait_until(check)
    with pytest.raises(AssertionError, match="the thing"):
        wait_until(lambda: False, timeout=0.05, what="the thing")

    async def acheck() -> bool:
        await asyncio.sleep(0)
        return True

    asyncio.run(wait_until_async(acheck))
    with pytest.raises(AssertionError, match="timed out"):
        asyncio.run(wait_until_async(lambda: False, timeout=0.05))


def test_the_in_memory_broker_needs_aio_pika_only_for_async_apps() -> None:
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from ackkit import App\n"
        "from ackkit.testing import InMemoryBroker\n"
        "with InMemoryBroker() as b:\n"
        "    b.connect().channel().queue_declare('q')\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('aio_pika', 'aiormq')))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "[]"


USER_SUITE = """
from ackkit import App

def test_service(amqp_broker, queue_factory):
    q = queue_factory(broker=amqp_broker)
    seen = []
    app = App(amqp_broker.url, shutdown_timeout=5)

    @app.listener(q)
    def handle(order: dict) -> None:
        seen.append(order)

    with app.running():
        amqp_broker.publish(q, {"id": 1})
        amqp_broker.wait_for(q, ready=0, unacked=0)
    assert seen == [{"id": 1}]
    print("BROKER-KIND", amqp_broker.kind)
"""


def run_user_suite(tmp_path: Any, *args: str, env: dict[str, str] | None = None) -> str:
    import os
    import subprocess
    import sys

    (tmp_path / "test_user.py").write_text(USER_SUITE)
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **(env or {})},
    )
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def test_amqp_broker_is_in_memory_unless_a_real_one_is_asked_for(tmp_path: Any) -> None:
    import os

    env = {k: v for k, v in os.environ.items() if k != "ACKKIT_TEST_REAL_BROKER"}
    assert "BROKER-KIND memory" in run_user_suite(tmp_path, env=env)
