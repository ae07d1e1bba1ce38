"""Queue(name, quorum=True) on a real broker (3.10 and 4.3): the broker reports the
listener's queue, its delay queues and its DLQ as quorum queues; broker-delayed retry and
dead-lettering work through them; an existing queue of another type stops the start with
a TopologyConflict naming it and the mismatch (nothing is converted)."""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any

import pytest
from _apps import Runner
from _retry_support import publish, wait_until

from ackkit import App, AsyncApp, AsyncDelivery, Delivery, Queue, Retry
from ackkit._core.topology import DLQ_DELIVERY_LIMIT
from ackkit.dead_letters import inspect_dead_letters
from ackkit.errors import TopologyConflict
from ackkit.testing import DeclaredQueue

pytestmark = pytest.mark.integration

RETRY = Retry(max_attempts=3, initial_interval=0.2, multiplier=2.0)  # tiers 200 and 400 ms


def queues_named(broker: Any, prefix: str) -> dict[str, DeclaredQueue]:
    """The queues named `prefix`..., each with its type and arguments, as the node itself
    reports them (erl_call on the kit's node, rabbitmqctl elsewhere)."""
    names = [name for name in broker.queue_names() if name.startswith(prefix)]
    found = {name: broker.declared(name) for name in names}
    return {name: d for name, d in found.items() if d is not None}


def register(app: App | AsyncApp, queue: str, seen: Counter[str], lock: threading.Lock) -> None:
    """A handler that fails "flaky" once, "bad" always, "ok" never."""

    def outcome(body: bytes) -> None:
        kind = body.decode()
        with lock:
            seen[kind] += 1
            n = seen[kind]
        if kind == "bad" or (kind == "flaky" and n == 1):
            raise RuntimeError(f"{kind} fails (call {n})")

    if isinstance(app, App):

        @app.listener(Queue(queue, quorum=True), retry=RETRY)
        def h(d: Delivery) -> None:
            outcome(d.body)

    else:

        @app.listener(Queue(queue, quorum=True), retry=RETRY)
        async def ah(d: AsyncDelivery) -> None:
            outcome(d.body)


@pytest.mark.parametrize("app_cls", [App, AsyncApp])
def test_every_queue_is_quorum_and_retry_and_dead_letter_work(
    rabbitmq: Any, fresh_queue: str, app_cls: type
) -> None:
    q = fresh_queue
    seen: Counter[str] = Counter()
    lock = threading.Lock()
    app = app_cls(rabbitmq.url)
    register(app, q, seen, lock)
    r = Runner(app)
    r.start()
    try:
        rows = queues_named(rabbitmq, q)
        assert sorted(rows) == sorted([q, f"{q}.dlq", f"{q}.retry.200ms", f"{q}.retry.400ms"])
        assert {name: row.type for name, row in rows.items()} == dict.fromkeys(rows, "quorum")
        assert rows[f"{q}.dlq"].arguments["x-delivery-limit"] == DLQ_DELIVERY_LIMIT
        delay = rows[f"{q}.retry.400ms"].arguments
        assert delay["x-message-ttl"] == 400
        assert delay["x-dead-letter-strategy"] == "at-least-once"
        for body in ("ok", "flaky", "bad"):
            publish(rabbitmq.url, q, body, message_id=body)
        rabbitmq.wait_for(f"{q}.dlq", ready=1, timeout=30)
        assert wait_until(lambda: seen["flaky"] == 2, timeout=10)
        for name in (q, f"{q}.retry.200ms", f"{q}.retry.400ms"):
            rabbitmq.wait_for(name, ready=0, unacked=0, timeout=10)
    finally:
        r.stop()
    assert seen == {"ok": 1, "flaky": 2, "bad": 3}
    # the DLQ tool reads the quorum DLQ, twice: nothing removed, nothing counted away
    for _ in range(2):
        (letter,) = inspect_dead_letters(rabbitmq.url, f"{q}.dlq")
        assert letter.message_id == "bad" and letter.attempts == 3
        assert letter.error_type == "RuntimeError" and letter.original_queue == q
        assert "attempts exhausted" in letter.reason
    assert rabbitmq.counts(f"{q}.dlq").ready == 1


@pytest.mark.parametrize("which", ["queue", "dlq", "delay"])
def test_an_existing_classic_queue_is_named_never_converted(
    rabbitmq: Any, fresh_queue: str, which: str
) -> None:
    q = fresh_queue
    name = {"queue": q, "dlq": f"{q}.dlq", "delay": f"{q}.retry.200ms"}[which]
    args = None
    if which == "delay":  # a classic delay queue of an earlier ackkit
        args = {
            "x-message-ttl": 200,
            "x-dead-letter-exchange": "",
            "x-dead-letter-routing-key": q,
        }
    publish(rabbitmq.url, name, b"kept", declare=True, arguments=args)
    app = App(rabbitmq.url, startup_timeout=60)
    register(app, q, Counter(), threading.Lock())
    t0 = time.monotonic()
    with pytest.raises(TopologyConflict) as info:
        app.start()
    text = str(info.value)
    assert f"{name!r} already exists" in text, text
    # the broker names the first argument that differs: for a delay queue of an earlier
    # ackkit that is x-overflow or x-queue-type, by version
    mismatch = "x-queue-type: the queue has" if which != "delay" else ": the queue has"
    assert mismatch in text and "ackkit declares" in text, text
    assert time.monotonic() - t0 < 30  # at once, not after the startup timeout
    # nothing converted: it is still a classic queue (with its message; the delay queue's
    # TTL has sent its own on to the listener's queue)
    declared = rabbitmq.declared(name)
    assert declared is not None and declared.type == "classic"
    rabbitmq.wait_for(name, total=0 if which == "delay" else 1, timeout=10)
