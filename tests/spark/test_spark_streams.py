"""The rabbitmq-stream source in a local Spark, against a real stream-enabled node.

Every check compares the output with what plain rstream reads from the stream (the
broker's word), by message_id: each published record exactly once. Super streams need
RabbitMQ 3.11+: those tests run on the 4.3 leg of make test; plain streams on both.
"""

from __future__ import annotations

import contextlib
import secrets
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pika
import pytest
from _spark_support import dlq_messages, output_ids

pytest.importorskip("pyspark")
pytest.importorskip("rstream")

import ackkit.spark as aks
from ackkit._core.headers import REASON
from spark.orders_pipeline import order_messages
from tests._streams import (
    declare_stream,
    declare_super_stream,
    delete_queues,
    last_offsets,
    message_ids,
    publish,
    publish_records,
    version_of,
)

pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.timeout(900)]

MODEL = "spark.orders_pipeline:Order"


@pytest.fixture(scope="module")
def node(stream_broker: Any) -> Any:
    return stream_broker


@pytest.fixture
def needs_super_streams(node: Any) -> None:
    if version_of(node.url) < (3, 11):
        pytest.skip("super streams need RabbitMQ 3.11+ (they run on the 4.3 leg)")


def _name(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(3)}"


def _orders(n: int, start: int = 0, poison_every: int = 0) -> list[tuple[str, bytes]]:
    return [(m, b) for m, b, _ok in order_messages(n, start=start, poison_every=poison_every)]


def _spread(node: Any, parts: list[str], items: list[tuple[str, bytes]]) -> None:
    for i, part in enumerate(parts):
        publish(node.url, node.stream_port, part, items[i :: len(parts)])


def _run(
    spark: Any,
    node: Any,
    base: Path,
    *,
    available_now: bool = True,
    timeout: float = 300,
    **options: Any,
) -> Any:
    """Run a query to the end of what is there (AvailableNow, or processAllAvailable);
    returns the stopped query."""
    df = aks.read_stream_source(
        spark,
        url=node.url,
        checkpoint=base / "ck",
        stream_port=node.stream_port,
        **options,
    )
    w = df.writeStream.foreachBatch(aks.parquet_batches(base / "out"))
    w = w.option("checkpointLocation", str(base / "ck"))
    from pyspark.errors import StreamingQueryException

    if available_now:
        query = aks.start(w.trigger(availableNow=True))
        with contextlib.suppress(StreamingQueryException):  # query.exception() says
            assert query.awaitTermination(timeout), "the AvailableNow query did not end"
    else:
        query = aks.start(w.trigger(processingTime="500 milliseconds"))
        try:
            with contextlib.suppress(StreamingQueryException):
                query.processAllAvailable()
        finally:
            query.stop()
    return query


def _exactly(spark: Any, base: Path, expected: list[str]) -> None:
    got = output_ids(spark, base / "out")
    dups = [m for m, c in Counter(got).items() if c > 1]
    assert not dups, f"{len(dups)} duplicated, e.g. {dups[:3]}"
    assert sorted(got) == sorted(expected)


def test_super_stream_exactly_once_across_restarts_and_new_partitions(
    spark: Any, node: Any, tmp_path: Path, needs_super_streams: None
) -> None:
    name = _name("ss")
    parts = declare_super_stream(node.url, name, 3)
    try:
        first = _orders(600)
        _spread(node, parts, first)
        query = _run(
            spark,
            node,
            tmp_path,
            available_now=False,
            super_stream=name,
            max_messages_per_trigger=250,
            store_offsets_as="ackkit-test",
        )
        assert query.exception() is None
        _exactly(spark, tmp_path, [m for m, _ in first])
        # the checkpoint names each partition and holds its tail: 200 records each
        assert last_offsets(tmp_path / "ck") == {p: 200 for p in parts}
        batches = sorted(p.name for p in (tmp_path / "out").iterdir() if p.name.startswith("b"))
        assert len(batches) >= 3  # 600 records at most 250 a batch
        # the committed positions are also on the broker, for other tools to see
        # (stored with commit(), i.e. up to the last batch but one)
        stored = _stored_offsets(node, parts, "ackkit-test")
        assert all(0 <= v < 200 for v in stored.values())

        # more data, and a fourth partition, while the query is down
        more = _orders(300, start=600)
        _spread(node, parts, more)
        parts += declare_super_stream(node.url, name, 1, first=3)
        extra = _orders(50, start=900)
        publish(node.url, node.stream_port, parts[3], extra)
        _run(spark, node, tmp_path, available_now=False, super_stream=name)
        _exactly(spark, tmp_path, [m for m, _ in first + more + extra])
        # (store_offsets_as wrote offset-tracking entries into the first three partitions:
        # they take offsets too, so those positions are a little past 300)
        ends = last_offsets(tmp_path / "ck")
        assert set(ends) == set(parts) and ends[parts[3]] == 50
        assert all(300 <= ends[p] < 320 for p in parts[:3]), ends
        # the stream itself still holds everything (nothing is consumed away)
        assert sum(len(message_ids(node.url, node.stream_port, p)) for p in parts) == 950
    finally:
        delete_queues(node.url, *parts)
        _delete_exchange(node.url, name)


def test_plain_stream_starting_positions(spark: Any, node: Any, tmp_path: Path) -> None:
    name = _name("plain")
    declare_stream(node.url, name)
    try:
        a = _orders(100)
        publish(node.url, node.stream_port, name, a)
        time.sleep(1.5)  # the next chunk is written later than `cut`
        cut = int(time.time() * 1000)
        time.sleep(0.5)
        b = _orders(40, start=100)
        publish(node.url, node.stream_port, name, b)

        runs = {
            "earliest": [m for m, _ in a + b],
            "latest": [],
            "offset:90": [m for m, _ in (a + b)[90:]],
            f"timestamp:{cut}": [m for m, _ in b],
        }
        for start, expected in runs.items():
            base = tmp_path / start.replace(":", "-")
            q = _run(spark, node, base, stream=name, starting_position=start)
            assert q.exception() is None
            _exactly(spark, base, expected)

        # AvailableNow again on the same checkpoints: only what came since
        c = _orders(25, start=140)
        publish(node.url, node.stream_port, name, c)
        _run(spark, node, tmp_path / "latest", stream=name, starting_position="latest")
        _exactly(spark, tmp_path / "latest", [m for m, _ in c])
        _run(spark, node, tmp_path / "earliest", stream=name, max_messages_per_trigger=7)
        _exactly(spark, tmp_path / "earliest", [m for m, _ in a + b + c])
    finally:
        delete_queues(node.url, name)


def test_records_of_every_body_kind_arrive_whole(spark: Any, node: Any, tmp_path: Path) -> None:
    # What other teams' clients write: an AMQP 0-9-1 publish (the broker converts it),
    # AMQP 1.0 messages whose body is two data sections, an amqp-value or an
    # amqp-sequence, and bytes that are no AMQP 1.0 message at all.
    import struct

    import rstream
    from rstream._pyamqp.message import Properties

    name = _name("kinds")
    declare_stream(node.url, name)
    try:
        conn = pika.BlockingConnection(pika.URLParameters(node.url))
        ch = conn.channel()
        ch.confirm_delivery()
        props = pika.BasicProperties(
            message_id="amqp091", content_type="text/plain", headers={"h": "v", "n": 7}
        )
        ch.basic_publish("", name, b"from pika", props)
        conn.close()
        two = b"\x00Ss\xc0\x06\x01\xa1\x03two" + b"\x00Su\xa0\x05hello"
        two += b"\x00Su\xb0" + struct.pack(">I", 6) + b" world"
        records = [
            two,
            rstream.AMQPMessage(value="a text value", properties=Properties(message_id="val")),
            rstream.AMQPMessage(value={"k": [1, 2]}, properties=Properties(message_id="map")),
            rstream.AMQPMessage(sequence=[[1, "x"]], properties=Properties(message_id="seq")),
            b"raw bytes, not AMQP",
        ]
        publish_records(node.url, node.stream_port, name, records)
        q = _run(spark, node, tmp_path, stream=name)
        assert q.exception() is None
        rows = spark.read.parquet(str(tmp_path / "out")).orderBy("offset").collect()
        got = [(r["message_id"], bytes(r["body"])) for r in rows]
        assert got == [
            ("amqp091", b"from pika"),
            ("two", b"hello world"),
            ("val", b"a text value"),
            ("map", b'{"k": [1, 2]}'),
            ("seq", b'[[1, "x"]]'),
            (None, b"raw bytes, not AMQP"),
        ]
        assert rows[0]["content_type"] == "text/plain"
        assert rows[0]["headers"] == {"h": "v", "n": "7"}
    finally:
        delete_queues(node.url, name)


def test_invalid_records_dead_lettered_or_failing(spark: Any, node: Any, tmp_path: Path) -> None:
    name = _name("poison")
    dlq = f"{name}.dlq"
    declare_stream(node.url, name)
    try:
        items = [(m, b) for m, b, _ok in order_messages(60, poison_every=10)]
        bad = {m for m, _b, ok in order_messages(60, poison_every=10) if not ok}
        assert bad
        publish(node.url, node.stream_port, name, items)
        q = _run(spark, node, tmp_path / "fail", stream=name, model=MODEL)
        assert q.exception() is not None
        assert "does not validate" in str(q.exception())

        q = _run(spark, node, tmp_path / "dl", stream=name, model=MODEL, on_invalid="dead_letter")
        assert q.exception() is None
        _exactly(spark, tmp_path / "dl", [m for m, _ in items if m not in bad])
        got = dlq_messages(node.url, dlq)
        assert {m for m, _h in got} == bad
        assert all(h.get(REASON) and h.get("x-stream") == name for _m, h in got)
    finally:
        delete_queues(node.url, name, dlq)


def test_data_loss_is_reported_or_counted(spark: Any, node: Any, tmp_path: Path) -> None:
    name = _name("retained")
    # tiny segments and a tiny size limit: old segments go as new ones fill
    declare_stream(
        node.url,
        name,
        **{"x-max-length-bytes": 20_000, "x-stream-max-segment-size-bytes": 4_000},
    )
    try:
        first = _orders(20)
        publish(node.url, node.stream_port, name, first)
        _run(spark, node, tmp_path, stream=name)
        _exactly(spark, tmp_path, [m for m, _ in first])
        for k in range(8):  # many small chunks, so that segments roll over
            publish(node.url, node.stream_port, name, _orders(40, start=20 + 40 * k))
        kept = message_ids(node.url, node.stream_port, name)
        assert "order-0000020" not in kept, "retention removed nothing: the test proves nothing"

        q = _run(spark, node, tmp_path, stream=name)
        assert q.exception() is not None
        assert "fail_on_data_loss=false" in str(q.exception())

        q = _run(spark, node, tmp_path, stream=name, fail_on_data_loss=False)
        assert q.exception() is None
        _exactly(spark, tmp_path, [m for m, _ in first] + kept)
    finally:
        delete_queues(node.url, name)


# -- helpers ---------------------------------------------------------------------------------


def _delete_exchange(url: str, name: str) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(url))
    try:
        conn.channel().exchange_delete(name)
    finally:
        conn.close()


def _stored_offsets(node: Any, parts: list[str], reference: str) -> dict[str, int]:
    import asyncio

    import rstream

    from ackkit.streams import stream_connection

    async def go() -> dict[str, int]:
        async with rstream.Consumer(**stream_connection(node.url, node.stream_port)) as c:
            return {p: await c.query_offset(p, reference) for p in parts}

    return asyncio.run(go())
