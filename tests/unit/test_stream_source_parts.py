"""The stream source's pure parts: options, record decoding, rows, super stream routing."""

from __future__ import annotations

import pytest

pytest.importorskip("pyspark")
rstream = pytest.importorskip("rstream")

from rstream._pyamqp.message import Properties  # noqa: E402

from ackkit.spark._core.batches import OnInvalid  # noqa: E402
from ackkit.spark._core.stream_offsets import StartFrom  # noqa: E402
from ackkit.spark._stream_options import StreamSourceOptions  # noqa: E402
from ackkit.spark._stream_rows import StreamRowSchema, record  # noqa: E402
from ackkit.streams import partition_for, stream_connection  # noqa: E402
from spark.orders_pipeline import Order, order_messages  # noqa: E402

URL = "amqp://user:p%40ss@127.0.0.1:5673/v%2Fh"


def test_options_parse_and_refuse() -> None:
    o = StreamSourceOptions.parse(
        {
            "url": URL,
            "checkpoint": "/tmp/ck",
            "super_stream": "orders",
            "max_messages_per_trigger": "100",
            "starting_position": "timestamp:5",
            "fail_on_data_loss": "false",
            "on_invalid": "dead_letter",
        }
    )
    assert o.name == "orders" and o.dlq == "orders.dlq"
    assert o.max_messages_per_trigger == 100
    assert o.starting_position.kind is StartFrom.TIMESTAMP
    assert not o.fail_on_data_loss and o.on_invalid is OnInvalid.DEAD_LETTER
    assert o.connection == {
        "host": "127.0.0.1",
        "port": 5552,
        "username": "user",
        "password": "p@ss",
        "vhost": "v/h",
    }
    with pytest.raises(ValueError, match="one of stream= or super_stream="):
        StreamSourceOptions.parse({"url": URL, "checkpoint": "/tmp/ck"})
    with pytest.raises(ValueError, match="unknown rabbitmq-stream source option"):
        StreamSourceOptions.parse({"url": URL, "checkpoint": "/c", "stream": "s", "queue": "q"})
    with pytest.raises(ValueError, match="max_messages_per_trigger"):
        StreamSourceOptions.parse(
            {"url": URL, "checkpoint": "/c", "stream": "s", "max_messages_per_trigger": "0"}
        )
    assert stream_connection("amqp://127.0.0.1", 1)["vhost"] == "/"


def test_records_decode_amqp_and_raw_bytes() -> None:
    mid, body, ok = next(order_messages(1))
    assert ok
    amqp = rstream.AMQPMessage(
        body=body,
        properties=Properties(message_id=mid, content_type="application/json"),
        application_properties={"k": "v", "n": 3},
    )
    r = record("s", 7, 1_700_000_000_000, bytes(amqp), Order)
    assert (r.stream, r.offset, r.message_id, r.body) == ("s", 7, mid, body)
    assert r.headers == {"k": "v", "n": "3"} and r.content_type == "application/json"
    assert r.error is None and r.parsed is not None and r.parsed["order_id"] == mid
    raw = record("s", 8, 0, b'{"not": "an order"}', Order)
    assert raw.message_id is None and raw.body == b'{"not": "an order"}'
    assert raw.error is not None  # invalid for the model: on_invalid decides
    assert record("s", 9, 0, b"\x00Sgarbage", None).body == b"\x00Sgarbage"


def test_rows_have_the_stream_columns_then_the_model() -> None:
    schema = StreamRowSchema(Order)
    names = [f.name for f in schema.spark.fields]
    assert names[:7] == [
        "stream",
        "offset",
        "message_id",
        "body",
        "headers",
        "content_type",
        "timestamp",
    ]
    assert names[7:] == list(Order.model_fields)
    mid, body, _ok = next(order_messages(1))
    amqp = rstream.AMQPMessage(body=body, properties=Properties(message_id=mid))
    batch = schema.batch([record("p-1", 3, 1_700_000_000_123, bytes(amqp), Order)])
    row = batch.to_pylist()[0]
    assert row["stream"] == "p-1" and row["offset"] == 3 and row["order_id"] == mid
    assert row["timestamp"].timestamp() == pytest.approx(1_700_000_000.123)


def test_partition_for_is_stable_and_spreads() -> None:
    parts = ["ss-0", "ss-1", "ss-2"]
    got = [partition_for(f"key-{i}", parts) for i in range(300)]
    assert got == [partition_for(f"key-{i}", parts) for i in range(300)]
    assert all(got.count(p) > 50 for p in parts)
    with pytest.raises(ValueError):
        partition_for("k", [])
