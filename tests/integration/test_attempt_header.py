"""One attempt-header rule on both runtimes, read from what the broker delivered.

A Java or .NET publisher may send `ackkit-attempt` as any AMQP field type (a double
2.5, a decimal, a string). pika reads a double as an int, so App took 2.5 for
attempt 2 and ran the handler while AsyncApp dead-lettered it as forged. Now the
core reads the raw value on both: only an integer field from 1 to
MAX_ATTEMPT_HEADER is an attempt number; anything else is dead-lettered as forged.
Messages are published byte for byte (tests/adversarial/rawamqp.py); the verdict is
read back from the broker (the DLQ's contents and reasons).
"""

from __future__ import annotations

import struct
import sys
import threading
from typing import Any

import pytest
from _apps import Runner
from _retry_support import REPO, drain, header_text, wait_until
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from ackkit import App, AsyncApp, AsyncDelivery, Consumer, Delivery
from ackkit._core import headers as H

if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
from tests.adversarial.rawamqp import RawClient
from tests.unit.test_attempt_header_rule import INTEGER_KINDS, fields

pytestmark = [pytest.mark.integration, pytest.mark.one_leg]

# Every integer width RabbitMQ accepts in a table; "l" is the one ackkit writes.
assert set(INTEGER_KINDS) >= {"b", "B", "s", "u", "I", "i", "l"}


def _table(field: bytes) -> bytes:
    entry = bytes((len(H.ATTEMPT),)) + H.ATTEMPT.encode() + field
    return struct.pack(">I", len(entry)) + entry


def _run(app_cls: type, rabbitmq: Any, q: str, cases: list[tuple[bytes, bool]]) -> dict[str, Any]:
    """Publish each case to `q` under a running app: {message id: attempt it ran as, or
    the dead-letter reason}, as the handler and the broker's DLQ show it."""
    ran: dict[str, int] = {}
    lock = threading.Lock()
    app = app_cls(rabbitmq.url)
    if app_cls is App:

        @app.listener(q, consumer=Consumer(prefetch=50))
        def h(d: Delivery) -> None:
            with lock:
                ran[str(d.message_id)] = d.attempt

    else:

        @app.listener(q, consumer=Consumer(prefetch=50))
        async def ah(d: AsyncDelivery) -> None:
            with lock:
                ran[str(d.message_id)] = d.attempt

    runner = Runner(app)
    runner.start()
    try:
        with RawClient(rabbitmq.url) as c:
            for i, (field, _) in enumerate(cases):
                c.publish(
                    "", q, b"{}", {"message_id": f"m{i}"}, raw_headers_table_bytes=_table(field)
                )
        forged = sum(1 for _, valid in cases if not valid)
        rabbitmq.wait_for(f"{q}.dlq", ready=forged, timeout=20)
        rabbitmq.wait_for(q, ready=0, unacked=0, timeout=20)
        assert wait_until(lambda: len(ran) == len(cases) - forged, timeout=10)
    finally:
        runner.stop()
    out: dict[str, Any] = dict(ran)
    for props, _ in drain(rabbitmq.url, f"{q}.dlq"):
        out[props.message_id] = header_text(props.headers[H.REASON])
    return out


@settings(
    max_examples=3,
    deadline=None,
    phases=(Phase.explicit, Phase.generate),  # no shrinking: each example runs two apps
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(st.lists(fields(), min_size=6, max_size=16))
def test_both_runtimes_read_the_attempt_header_alike(
    rabbitmq: Any, queue_factory: Any, cases: list[tuple[bytes, bool]]
) -> None:
    cases += [(b"d" + struct.pack(">d", 2.5), False), (b"l" + struct.pack(">q", 3), True)]
    sync = _run(App, rabbitmq, queue_factory(), cases)
    asyn = _run(AsyncApp, rabbitmq, queue_factory(), cases)
    assert sync == asyn
    for i, (field, valid) in enumerate(cases):
        got = sync[f"m{i}"]
        if valid:
            assert got == struct.unpack(">" + INTEGER_KINDS[chr(field[0])][0][1:], field[1:])[0]
        else:
            assert isinstance(got, str) and got.startswith("invalid ackkit-attempt header"), got
