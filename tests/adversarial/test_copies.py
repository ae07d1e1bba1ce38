"""Copies ackkit publishes (retry, dead letter) of hostile messages, on both runtimes.

Each test asserts what the broker holds afterwards (the dead-letter queue's messages
and their raw headers, queue counts, how often the handler ran) and that the app
still consumes.
"""

from __future__ import annotations

import struct
import threading
import time
from collections import Counter
from typing import Any

import pika
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ackkit import Delivery, Retry
from ackkit._core import wire
from tests.adversarial.rawamqp import RawClient
from tests.contract.conftest import IO, Broker, Runtime, eventually

pytestmark = [pytest.mark.integration]

FAST = Retry(max_attempts=3, initial_interval=0.05)


class Runs:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.count: Counter[str] = Counter()

    def add(self, key: str) -> int:
        with self.lock:
            self.count[key] += 1
            return self.count[key]


def raw_headers(
    client: RawClient, queue: str
) -> list[tuple[bytes, dict[str, wire.Field], dict[str, Any]]]:
    """Every message of `queue`: body, headers as on the wire, the other properties."""
    out = []
    for m in client.get_all(queue):
        props = wire.decode_properties(m.header[12:])
        out.append((m.body, props.pop("headers", {}), props))
    return out


def consumes_still(runtime: Runtime, broker: Broker, q: str, runs: Runs) -> None:
    broker.publish(q, [b"ok"])
    eventually(lambda: runs.count["ok"] >= 1, what="a healthy message handled afterwards")
    broker.wait_for(q, ready=0, unacked=0)


def _fail_unless_ok(runs: Runs, fail: Any) -> Any:
    async def handle(payload: Delivery, d: Delivery, io: IO) -> None:
        key = d.body.decode("utf-8", "replace")
        runs.add(key)
        if key != "ok":
            fail(key, d)

    return handle


# -- every AMQP field type -----------------------------------------------------------

EVERY_TYPE = {
    "t": b"t\x01",
    "b": b"b\xff",
    "B": b"B\xc8",
    "s": b"s\x80\x00",
    "u": b"u\xff\xfe",
    "I": b"I" + struct.pack(">i", -5),
    "i": b"i" + struct.pack(">I", 2**32 - 1),
    "L": b"L" + struct.pack(">q", -(2**60)),
    "l": b"l" + struct.pack(">q", 2**40),
    "f": b"f" + struct.pack(">f", 2.5),
    "d": b"d" + struct.pack(">d", 0.1),
    "D": b"D\x02" + struct.pack(">i", 150),
    "S-utf8": b"S\x00\x00\x00\x03\xc3\xa9!",
    "S-binary": b"S\x00\x00\x00\x02\xff\xfe",
    "x": b"x\x00\x00\x00\x02\x00\xff",
    "T": b"T" + struct.pack(">Q", 1_700_000_000),
    "V": b"V",
    "A": b"A\x00\x00\x00\x0eS\x00\x00\x00\x01at\x00VF\x00\x00\x00\x00",
    "F": b"F\x00\x00\x00\x0c\x01kS\x00\x00\x00\x01v\x01bt\x01",
}
_INT_FMT = {"b": ">b", "B": ">B", "s": ">h", "u": ">H", "I": ">i", "i": ">I", "L": ">q", "l": ">q"}


def _number(f: bytes) -> float:
    tag = chr(f[0])
    fmt = _INT_FMT.get(tag) or {"f": ">f", "d": ">d"}[tag]
    return struct.unpack(fmt, f[1:])[0]  # type: ignore[no-any-return]


def test_every_amqp_type_survives_a_retry_and_a_dead_letter(
    runtime: Runtime, broker: Broker, queue_factory: Any
) -> None:
    """Byte for byte on the pika runtime (it reads the original's raw headers). aiormq
    hands ackkit decoded values only: integers come back in 'I'/'l' and a float as a
    double with the same value; every other type is byte for byte there too. The one
    change on both is the broker's: 'L' becomes 'l' on the delay queue's hop. Over AMQP
    1.0 the values survive, their 0-9-1 widths not (below)."""
    q = queue_factory(declare=True)
    runs = Runs()

    def fail(key: str, d: Delivery) -> None:
        raise ValueError("always")

    app = runtime.app()
    runtime.listen(
        app, q, _fail_unless_ok(runs, fail), retry=Retry(max_attempts=2, initial_interval=0.05)
    )
    table = struct.pack(">I", sum(1 + len(k) + len(v) for k, v in EVERY_TYPE.items()))
    table += b"".join(bytes([len(k)]) + k.encode() + v for k, v in EVERY_TYPE.items())
    with RawClient(broker.handle.url) as raw, runtime.running(app):
        raw.publish(
            "", q, b"typed", {"message_id": "m-typed", "priority": 3}, raw_headers_table_bytes=table
        )
        broker.wait_for(f"{q}.dlq", ready=1)
        consumes_still(runtime, broker, q, runs)
        ((body, h, props),) = raw_headers(raw, f"{q}.dlq")
    assert body == b"typed" and runs.count["typed"] == 2
    assert props["message_id"] == "m-typed" and props["priority"] == 3
    for k, want in EVERY_TYPE.items():
        got = h[k].raw
        if runtime.kind == "amqp10" and k[0] in "bBsuIiLlfDx":
            # the decimal header ends the AMQP 1.0 connection (RabbitMQ cannot convert
            # it), so the runtime took this message over 0-9-1; its retry copy went out
            # over AMQP 1.0, whose types carry every value but not 0-9-1's widths
            if k[0] == "D":
                assert got == b"S\x00\x00\x00\x041.50", got  # 150 * 10**-2, as its text
            elif k[0] == "x":
                assert got == b"S" + want[1:], got  # the same bytes, as a string
            else:
                assert chr(got[0]) == ("d" if k == "f" else "l"), (k, got)
                assert _number(got) == _number(want), k
        elif runtime.kind == "async" and k[0] in "bBsuIiLlf":
            assert chr(got[0]) in ("d" if k == "f" else "Il"), (k, got)
            assert _number(got) == _number(want), k
        elif k == "L":
            # RabbitMQ itself writes 'L' back as 'l' (both signed 64) when the delay
            # queue dead-letters the retry copy (checked with a plain TTL queue too).
            assert got == b"l" + want[1:], got
        else:
            assert got == want, (k, got, want)


# -- exception texts ---------------------------------------------------------------------

texts = st.text(max_size=30).map(lambda s: s + "\ud800") | st.sampled_from(
    ["\udfff" * 3, "x" * 300_000, "\ud83d" + "y" * 140_000, ""]
)


@settings(max_examples=3, deadline=None, suppress_health_check=list(HealthCheck))
@given(messages=st.lists(texts, min_size=1, max_size=5))
def test_unencodable_and_huge_exception_messages_are_dead_lettered(
    runtime: Runtime, broker: Broker, queue_factory: Any, messages: list[str]
) -> None:
    q = queue_factory(declare=True)
    runs = Runs()
    by_key = {f"m{i}": m for i, m in enumerate(messages)}

    def fail(key: str, d: Delivery) -> None:
        raise ValueError(by_key[key])

    app = runtime.app()
    runtime.listen(app, q, _fail_unless_ok(runs, fail), retry=FAST)
    broker.publish(q, list(by_key))
    with runtime.running(app):
        broker.wait_for(f"{q}.dlq", ready=len(by_key), timeout=30)
        consumes_still(runtime, broker, q, runs)
    dead = broker.take_all(f"{q}.dlq")
    assert sorted(m.body.decode() for m in dead) == sorted(by_key)
    for m in dead:
        assert m.headers["ackkit-reason"].startswith("attempts exhausted")
        assert m.headers["ackkit-error-type"] == "ValueError"
    assert all(runs.count[k] == 3 for k in by_key)


# -- headers near frame_max ------------------------------------------------------------

FRAME_MAX = 131072


@pytest.mark.parametrize("room", [40, 600, 3000, 20000])
def test_a_message_with_headers_near_frame_max_is_still_retried_and_dead_lettered(
    runtime: Runtime, broker: Broker, queue_factory: Any, room: int
) -> None:
    """The original fits one frame with `room` bytes to spare; ackkit's headers would
    not (a traceback of up to 4000 characters, the error, the reason...)."""
    q = queue_factory(declare=True)
    runs = Runs()

    def fail(key: str, d: Delivery) -> None:
        raise ValueError("E" * 900)

    base = {"content_type": "application/json", "delivery_mode": 2, "message_id": "m1"}
    pad = (
        FRAME_MAX
        - wire.FRAME_OVERHEAD
        - len(wire.encode_properties({**base, "headers": {"pad": ""}}))
        - room
    )
    app = runtime.app()
    runtime.listen(app, q, _fail_unless_ok(runs, fail), retry=FAST)
    with RawClient(broker.handle.url) as raw, runtime.running(app):
        raw.publish("", q, b"big", {**base, "headers": {"pad": "p" * pad}})
        broker.wait_for(f"{q}.dlq", ready=1, timeout=30)
        consumes_still(runtime, broker, q, runs)
        ((body, h, props),) = raw_headers(raw, f"{q}.dlq")
    assert body == b"big" and runs.count["big"] == 3 and props["message_id"] == "m1"
    reason = h["ackkit-reason"].raw
    assert b"attempts exhausted" in reason
    if "pad" in h:
        assert h["pad"].raw == b"S" + struct.pack(">I", pad) + b"p" * pad
    else:
        assert "ackkit-headers-dropped" in h


# -- per-message expiration --------------------------------------------------------------


def test_a_dead_letter_does_not_expire_out_of_the_dead_letter_queue(
    runtime: Runtime, broker: Broker, queue_factory: Any
) -> None:
    q = queue_factory(declare=True)
    runs = Runs()

    def fail(key: str, d: Delivery) -> None:
        raise ValueError("no")

    app = runtime.app()
    runtime.listen(app, q, _fail_unless_ok(runs, fail), retry=FAST)
    with runtime.running(app):
        # Published once the consumer is there: a message that expired in the queue
        # before a slow start reached the consumer (a loaded machine) would test nothing.
        broker.wait_for(q, consumers=1, timeout=30)
        conn = broker.handle.connect()
        try:
            ch = conn.channel()
            props = pika.BasicProperties(expiration="3000", message_id="e1")
            ch.basic_publish("", q, b"ttl", props)
            published = time.monotonic()
        finally:
            conn.close()
        broker.wait_for(f"{q}.dlq", ready=1, timeout=30)
        consumes_still(runtime, broker, q, runs)
    time.sleep(max(0.0, published + 3.5 - time.monotonic()))  # past the original's expiration
    assert broker.counts(f"{q}.dlq").ready == 1
    with RawClient(broker.handle.url) as raw:
        ((body, h, props),) = raw_headers(raw, f"{q}.dlq")
    assert body == b"ttl" and "expiration" not in props
    assert h["ackkit-original-expiration"].raw == b"S\x00\x00\x00\x043000"


# -- hostile broker headers -------------------------------------------------------------

HOSTILE: list[dict[str, Any]] = [
    {"x-death": "not a list"},
    {"x-death": [1, "a", None, {"count": "many", "queue": 7, "time": "never"}]},
    {"x-death": [{"count": -1, "reason": "expired", "routing-keys": {"k": [[["deep"]]]}}]},
    {"x-first-death-queue": 5, "x-last-death-reason": ["x"], "x-delivery-count": "lots"},
    {"x-death": {"nested": {"garbage": [b"\xff", 1.5]}}, "CC": ["nowhere"]},
]


def test_hostile_x_death_headers_do_not_disturb_the_delay_queue(
    runtime: Runtime, broker: Broker, queue_factory: Any
) -> None:
    """Hostile messages fail every attempt; healthy ones waiting in the same delay queue
    fail once and then succeed: none is lost or duplicated."""
    q = queue_factory(declare=True)
    runs = Runs()

    def fail(key: str, d: Delivery) -> None:
        if key.startswith("h") or runs.count[key] == 1:
            raise ValueError("retry me")

    app = runtime.app()
    runtime.listen(app, q, _fail_unless_ok(runs, fail), retry=FAST)
    healthy = [f"n{i}" for i in range(20)]
    with RawClient(broker.handle.url) as raw, runtime.running(app):
        for i, h in enumerate(HOSTILE):
            raw.publish("", q, f"h{i}".encode(), {"message_id": f"h{i}", "headers": h})
            for n in healthy[i * 4 : i * 4 + 4]:
                raw.publish("", q, n.encode(), {"message_id": n})
        broker.wait_for(f"{q}.dlq", ready=len(HOSTILE), timeout=30)
        eventually(lambda: all(runs.count[n] == 2 for n in healthy), what="healthy twice")
        consumes_still(runtime, broker, q, runs)
        time.sleep(0.5)
        dead = raw_headers(raw, f"{q}.dlq")
    assert sorted(b.decode() for b, _, _ in dead) == [f"h{i}" for i in range(len(HOSTILE))]
    for _, h, _ in dead:
        assert not {"x-death", "x-first-death-queue", "x-delivery-count", "CC"} & set(h)
    assert all(runs.count[f"h{i}"] == 3 for i in range(len(HOSTILE)))
    assert all(runs.count[n] == 2 for n in healthy)
    assert broker.counts(f"{q}.retry.50ms").ready == 0


def test_a_cc_header_does_not_route_the_retry_copy_to_its_queues_again(
    runtime: Runtime, broker: Broker, queue_factory: Any
) -> None:
    q = queue_factory(declare=True)
    other = queue_factory(declare=True)
    runs = Runs()

    def fail(key: str, d: Delivery) -> None:
        if runs.count[key] == 1:
            raise ValueError("once")

    app = runtime.app()
    runtime.listen(app, q, _fail_unless_ok(runs, fail), retry=FAST)
    conn = broker.handle.connect()
    try:
        conn.channel().basic_publish("", q, b"cc", pika.BasicProperties(headers={"CC": [other]}))
    finally:
        conn.close()
    with runtime.running(app):
        eventually(lambda: runs.count["cc"] == 2, what="handled twice")
        consumes_still(runtime, broker, q, runs)
    time.sleep(0.3)
    assert broker.counts(other).ready == 1  # the producer's CC copy, and only that one
