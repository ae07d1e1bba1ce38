"""A handler sees the same header values, of the same Python types, on the in-memory
broker as on RabbitMQ, on each runtime: what the runtime's client library hands over
(pika for App, aio-pika's aiormq / pamqp for AsyncApp).

The clients differ: a byte-array ('x') is `bytes` to pika and `bytearray` to pamqp;
float and double are ints to pika (its `long`, an int subclass, as is a long-long 'l'),
which App gives back as floats (Delivery.headers, from the bytes it keeps: pika's view
here is read the same way, `read_headers`);
a long string ('S') that is not UTF-8 is `bytes` to both, text otherwise. So the
in-memory broker must hand each runtime what its client decodes from what RabbitMQ
sends, the headers RabbitMQ writes itself (x-death, x-delivery-count,
x-acquired-count) included. Each case publishes the same encoded header table to both
brokers, under the same queue names.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import decimal
import struct
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import aio_pika
import pika
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ackkit
from ackkit import AckMode, App, AsyncApp, Delivery
from ackkit._core.wire import Field
from ackkit._sync._pika import WireProperties, blocking_connection, read_headers
from ackkit.pull import AsyncPullConnection
from ackkit.testing import BrokerHandle, InMemoryBroker

from .conftest import LoopThread, eventually

pytestmark = [pytest.mark.contract, pytest.mark.integration]


def _long(b: bytes) -> bytes:
    return struct.pack(">I", len(b)) + b


def _table(**fields: bytes) -> bytes:
    return _long(b"".join(bytes((len(k),)) + k.encode() + v for k, v in fields.items()))


HEADERS: dict[str, bytes] = {
    "byte-array": b"x" + _long(b"order-1"),
    "byte-array-binary": b"x" + _long(b"\xff-x"),
    "long-string": b"S" + _long("h\u00e9".encode()),
    "long-string-binary": b"S" + _long(b"\xff-y"),
    "decimal": b"D" + struct.pack(">Bi", 2, 125),
    "decimal-negative": b"D" + struct.pack(">Bi", 2, -125),
    "timestamp": b"T" + struct.pack(">Q", 1_704_164_645),
    "float": b"f" + struct.pack(">f", 1.5),
    "double": b"d" + struct.pack(">d", 2.75),
    "short-short": b"b" + struct.pack(">b", -3),
    "short": b"s" + struct.pack(">h", -300),
    "long": b"I" + struct.pack(">i", -70_000),
    "unsigned-long": b"i" + struct.pack(">I", 4_000_000_000),
    "long-long": b"l" + struct.pack(">q", -(2**40)),
    "bool": b"t\x01",
    "void": b"V",
    "table": b"F"
    + _table(a=b"x" + _long(b"z"), b=b"S" + _long(b"\xfe"), c=b"D" + struct.pack(">Bi", 1, 5)),
    "array": b"A" + _long(b"I\x00\x00\x00\x01" + b"S" + _long(b"x") + b"x" + _long(b"y")),
    "array-of-table": b"A" + _long(b"F" + _table(k=b"x" + _long(b"w"))),
}
"""One header of each field type a client may publish (RabbitMQ keeps them as sent)."""


VARYING = frozenset({"time"})
"""Values compared by type only: an x-death time (the brokers wrote it at different
moments)."""


def shape(value: Any, key: str = "") -> Any:
    """`value` with the type of every leaf: (type name, repr); `VARYING` by type only."""
    if isinstance(value, dict):
        return {k: shape(v, k) for k, v in sorted(value.items())}
    if isinstance(value, list):
        return [shape(v) for v in value]
    if key in VARYING:
        return type(value).__name__
    return (type(value).__name__, repr(value))


def publish(handle: BrokerHandle, queue: str, raw: dict[str, bytes]) -> None:
    """Publish one message whose headers are the encoded fields `raw`, byte for byte."""
    conn = handle.connect()
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        headers = {k: Field(v) for k, v in raw.items()}
        ch.basic_publish(
            "", queue, b"{}", WireProperties({"headers": headers, "message_id": "m-1"})
        )
    finally:
        conn.close()


def settle_first(handle: BrokerHandle, queue: str, *, requeue: bool) -> None:
    """Take the head of `queue` and give it back (`requeue`) or reject it (dead-letter)."""
    conn = handle.connect()
    try:
        ch = conn.channel()
        method, _, _ = ch.basic_get(queue)
        assert method is not None
        if requeue:
            ch.basic_nack(method.delivery_tag, requeue=True)
        else:
            ch.basic_reject(method.delivery_tag, requeue=False)
    finally:
        conn.close()


PATHS = ("published", "dead-lettered", "redelivered")
"""How the message reaches the handler: as published to a classic queue; dead-lettered
by the broker (x-death, x-first-death-*); returned once to a quorum queue
(x-delivery-count, on 4.3 x-acquired-count)."""


def stage(handle: BrokerHandle, names: dict[str, str]) -> None:
    """Declare the queues and leave one message on each path's queue."""
    conn = handle.connect()
    try:
        ch = conn.channel()
        ch.queue_declare(names["published"], durable=True)
        ch.queue_declare(names["dead-lettered"], durable=True)
        ch.queue_declare(
            names["source"],
            durable=True,
            arguments={
                "x-dead-letter-exchange": "",
                "x-dead-letter-routing-key": names["dead-lettered"],
            },
        )
        ch.queue_declare(names["redelivered"], durable=True, arguments={"x-queue-type": "quorum"})
    finally:
        conn.close()
    publish(handle, names["published"], HEADERS)
    publish(handle, names["source"], HEADERS)
    settle_first(handle, names["source"], requeue=False)
    handle.wait_for(names["dead-lettered"], ready=1)
    publish(handle, names["redelivered"], HEADERS)
    settle_first(handle, names["redelivered"], requeue=True)


LISTENER: dict[str, dict[str, Any]] = {
    "published": {},
    "dead-lettered": {"ack_mode": AckMode.NONE},
    "redelivered": {"ack_mode": AckMode.NONE},
}
"""A redelivery an acking listener did not requeue itself runs on a copy (a lost run,
`_core.lost`) that carries ackkit's headers, not the broker's (the quorum queue's return
is one; so is the dead-lettered copy on RabbitMQ 4.3, which arrives redelivered): a
listener without acks hands those over as they came."""


def handler_sees(kind: str, handle: BrokerHandle, names: dict[str, str], lt: LoopThread) -> Any:
    """The headers (shaped) each path's message reaches an App's or AsyncApp's handler with."""
    seen: dict[str, Any] = {}
    lock = threading.Lock()

    def record(path: str) -> Callable[[dict[str, Any]], None]:
        def put(headers: dict[str, Any]) -> None:
            with lock:
                seen[path] = shape(headers)

        return put

    if kind == "sync":
        app: Any = App(handle.url, shutdown_timeout=5.0)
        for path in PATHS:
            put = record(path)

            def sync_handler(payload: dict[str, Any], d: Delivery, put: Any = put) -> None:
                put(dict(d.headers or {}))

            sync_handler.__name__ = sync_handler.__qualname__ = path.replace("-", "_")
            app.listener(names[path], **LISTENER[path])(sync_handler)
        app.start()
        try:
            eventually(lambda: len(seen) == len(PATHS), what="every path handled")
        finally:
            app.stop()
    else:
        app = AsyncApp(handle.url, shutdown_timeout=5.0)
        for path in PATHS:
            put = record(path)

            async def async_handler(payload: dict[str, Any], d: Delivery, put: Any = put) -> None:
                put(dict(d.headers or {}))

            async_handler.__name__ = async_handler.__qualname__ = path.replace("-", "_")
            app.listener(names[path], **LISTENER[path])(async_handler)
        lt.run(app.start())
        try:
            eventually(lambda: len(seen) == len(PATHS), what="every path handled")
        finally:
            lt.run(app.stop())
    return seen


def client_sees(kind: str, handle: BrokerHandle, names: dict[str, str], lt: LoopThread) -> Any:
    """The headers (shaped) the runtime's client library itself hands over for each path on
    a real broker: pika's for App, aio-pika's for AsyncApp."""
    out: dict[str, Any] = {}
    if kind == "sync":
        conn = blocking_connection(pika.URLParameters(handle.url))
        try:
            ch = conn.channel()
            for path in PATHS:
                method, props, _ = ch.basic_get(names[path], auto_ack=True)
                assert method is not None
                out[path] = shape(read_headers(props))
        finally:
            conn.close()
        return out

    async def read() -> None:
        conn = await aio_pika.connect(handle.url)
        try:
            ch = await conn.channel()
            for path in PATHS:
                queue = await ch.get_queue(names[path], ensure=False)
                message = await queue.get(no_ack=True)
                assert message is not None
                out[path] = shape(dict(message.headers))
        finally:
            await conn.close()

    lt.run(read())
    return out


def delete(handle: BrokerHandle, queues: Any) -> None:
    for queue in queues:
        handle.delete(queue)


LAST_DEATH = frozenset({"x-last-death-reason", "x-last-death-queue", "x-last-death-exchange"})
"""Written from RabbitMQ 3.13 on: the in-memory broker follows 3.13 unless told otherwise,
the kit's default node is 3.10."""


def older(headers: dict[str, Any], other: dict[str, Any]) -> dict[str, Any]:
    """`headers` without the 3.13 ones `other` (from an older node) lacks."""
    return {k: v for k, v in headers.items() if k not in LAST_DEATH - other.keys()}


def like(real: str) -> str | None:
    """The in-memory rules closest to a real broker's version ("4.3.6" -> "4.3"): the
    headers a quorum queue writes on a return differ between 3.x and 4.x. None: 3.13."""
    major, minor = (int(p) for p in [*real.split("."), "0", "0"][:2])
    if major < 4:
        return None
    return "4.3" if (major, minor) >= (4, 3) else "4.0"


@pytest.fixture
def memory_broker(rabbitmq_version: str) -> Iterator[InMemoryBroker]:
    """The in-memory broker on the rules of the real broker it is compared with (the
    Docker leg's 4.3 image runs without ACKKIT_TEST_RABBITMQ, which the kit's fixture
    reads)."""
    with InMemoryBroker(rabbitmq=like(rabbitmq_version)) as broker:
        yield broker


@pytest.fixture
def loop() -> Iterator[LoopThread]:
    lt = LoopThread()
    yield lt
    lt.close()


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_handlers_see_the_header_types_their_client_hands_over(
    kind: str, rabbitmq: BrokerHandle, memory_broker: InMemoryBroker, loop: LoopThread
) -> None:
    """The same encoded headers, published to RabbitMQ and to the in-memory broker, reach
    the handler with the same values and types on both, on each runtime; on RabbitMQ that
    is what pika (App) or aio-pika (AsyncApp) hands over. Each path: as published, as
    dead-lettered by the broker, as returned once to a quorum queue."""
    base = f"t.header-types.{kind}.{uuid.uuid4().hex[:8]}"
    names = {p: f"{base}.{p}" for p in (*PATHS, "source")}
    try:
        seen: dict[str, Any] = {}
        for where, handle in (("rabbitmq", rabbitmq), ("memory", memory_broker)):
            stage(handle, names)
            seen[where] = handler_sees(kind, handle, names, loop)
        stage(rabbitmq, names)
        client = client_sees(kind, rabbitmq, names, loop)
    finally:
        delete(rabbitmq, names.values())

    for path in PATHS:
        real, memory = seen["rabbitmq"][path], seen["memory"][path]
        assert set(HEADERS) <= real.keys() & memory.keys(), path
        assert older(memory, real) == older(real, memory), path
        assert real == client[path], path
    broker_written = seen["memory"]["dead-lettered"]["x-death"][0]
    assert broker_written["time"] == "datetime"
    counts = {k: v for k, v in seen["memory"]["redelivered"].items() if k.startswith("x-")}
    assert counts, "a quorum queue writes its count header on a return"
    user = seen["memory"]["published"]
    if kind == "sync":
        assert user["byte-array"] == ("bytes", "b'order-1'")
    else:
        assert user["byte-array"] == ("bytearray", "bytearray(b'order-1')")


# -- any header table ------------------------------------------------------------------------

_NAMES = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=8)


def _leaf() -> st.SearchStrategy[bytes]:
    def sized(kind: bytes) -> Callable[[bytes], bytes]:
        return lambda b: kind + _long(b)

    return st.one_of(
        st.binary(max_size=12).map(sized(b"x")),
        st.binary(max_size=12).map(sized(b"S")),
        st.text(max_size=8).map(lambda s: b"S" + _long(s.encode("utf-8", "surrogatepass"))),
        st.tuples(st.integers(0, 255), st.integers(-(2**31), 2**31 - 1)).map(
            lambda t: b"D" + struct.pack(">Bi", *t)
        ),
        st.integers(0, 2**32 - 1).map(lambda n: b"T" + struct.pack(">Q", n)),
        st.integers(-(2**31), 2**31 - 1).map(lambda n: b"I" + struct.pack(">i", n)),
        st.integers(-(2**63), 2**63 - 1).map(lambda n: b"l" + struct.pack(">q", n)),
        st.floats(width=32, allow_nan=False, allow_infinity=False).map(
            lambda f: b"f" + struct.pack(">f", f)
        ),
        st.floats(allow_nan=False, allow_infinity=False).map(lambda f: b"d" + struct.pack(">d", f)),
        st.integers(-128, 127).map(lambda n: b"b" + struct.pack(">b", n)),
        st.integers(-(2**15), 2**15 - 1).map(lambda n: b"s" + struct.pack(">h", n)),
        st.booleans().map(lambda v: b"t" + bytes((v,))),
        st.just(b"V"),
    )


def _nested(children: st.SearchStrategy[bytes]) -> st.SearchStrategy[bytes]:
    return st.one_of(
        st.lists(children, max_size=3).map(lambda vs: b"A" + _long(b"".join(vs))),
        st.dictionaries(_NAMES, children, max_size=3).map(lambda t: b"F" + _table(**t)),
    )


FIELD_VALUES = st.recursive(_leaf(), _nested, max_leaves=8)
TABLES = st.dictionaries(_NAMES, FIELD_VALUES, min_size=1, max_size=5)


class Readers:
    """Read one message's headers four ways: pika and aio-pika on RabbitMQ, App's and
    AsyncApp's pull connections on the in-memory broker (the decoders their consumers use)."""

    def __init__(self, real: BrokerHandle, memory: InMemoryBroker, lt: LoopThread) -> None:
        self.real, self.memory, self.lt = real, memory, lt
        self.pika = blocking_connection(pika.URLParameters(real.url))
        self.pika_ch = self.pika.channel()
        self.stack = contextlib.ExitStack()
        self.sync_pull = self.stack.enter_context(ackkit.connect(memory.url))
        self.async_pull = AsyncPullConnection(memory.url)
        lt.run(self.async_pull.open())
        self.aio: Any = lt.run(aio_pika.connect(real.url))

    def pika_reads(self, queue: str) -> Any:
        method, props, _ = self.pika_ch.basic_get(queue, auto_ack=True)
        assert method is not None
        return shape(read_headers(props))

    def aio_pika_reads(self, queue: str) -> Any:
        async def read() -> Any:
            ch = await self.aio.channel()
            try:
                q = await ch.get_queue(queue, ensure=False)
                m = await q.get(no_ack=True)
                assert m is not None
                return shape(dict(m.headers))
            finally:
                await ch.close()

        return self.lt.run(read())

    def app_reads(self, queue: str) -> Any:
        d = self.sync_pull.get(queue)
        assert d is not None
        d.ack()
        return shape(dict(d.headers or {}))

    def async_app_reads(self, queue: str) -> Any:
        async def read() -> Any:
            d = await self.async_pull.get(queue)
            assert d is not None
            await d.ack()
            return shape(dict(d.headers or {}))

        return self.lt.run(read())

    def close(self) -> None:
        self.pika.close()
        self.stack.close()
        self.lt.run(self.async_pull.close())
        self.lt.run(self.aio.close())


def test_any_header_table_reads_as_each_client_reads_it(
    rabbitmq: BrokerHandle, loop: LoopThread
) -> None:
    """Any table of field values (each client-decodable type, nested in tables and
    arrays): App on the in-memory broker sees what pika reads from RabbitMQ, AsyncApp
    what aio-pika reads."""
    queue = f"t.header-types.any.{uuid.uuid4().hex[:8]}"
    with InMemoryBroker(rabbitmq=like(rabbitmq.server_version())) as memory:
        for handle in (rabbitmq, memory):
            conn = handle.connect()
            conn.channel().queue_declare(queue, durable=True, auto_delete=False)
            conn.close()
        readers = Readers(rabbitmq, memory, loop)
        try:

            @settings(max_examples=40, suppress_health_check=[HealthCheck.too_slow])
            @given(TABLES)
            def check(raw: dict[str, bytes]) -> None:
                publish(rabbitmq, queue, raw)
                publish(rabbitmq, queue, raw)
                publish(memory, queue, raw)
                publish(memory, queue, raw)
                assert readers.app_reads(queue) == readers.pika_reads(queue)
                assert readers.async_app_reads(queue) == readers.aio_pika_reads(queue)

            check()
        finally:
            readers.close()
            delete(rabbitmq, [queue])


def test_shape_tells_the_client_types_apart() -> None:
    """What the comparisons rest on: bytes, bytearray, pika's long and int, a datetime and
    an int are told apart, and a broker-written time by type only."""
    assert shape({"a": b"x"}) != shape({"a": bytearray(b"x")})
    assert shape({"a": pika.compat.long(1)}) != shape({"a": 1})
    assert shape({"d": decimal.Decimal("1.25")}) == {"d": ("Decimal", "Decimal('1.25')")}
    stamp = dt.datetime(2024, 1, 2, tzinfo=dt.UTC)
    assert shape({"x-death": [{"time": stamp}]}) == {"x-death": [{"time": "datetime"}]}
    assert shape({"x-death": [{"time": 1}]}) != shape({"x-death": [{"time": stamp}]})
