"""The rows of the `rabbitmq-stream` source: a stream record's bytes to Arrow.

A record is an AMQP 1.0 message (what RabbitMQ stores for AMQP 0-9-1 and 1.0 publishers
and what rstream's `AMQPMessage` encodes); a record that is not one (a stream client
that wrote raw bytes) is taken as a body without properties. The model's fields are
parsed from the body exactly as the queue source does (`_rows.decode`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pydantic import BaseModel
from pyspark.sql.types import DataType, LongType, StringType, TimestampType

from .._core import amqp10
from ._rows import decode
from ._schema import MESSAGE_FIELDS, SourceSchema, _timestamps, arrow_batch, header_text

STREAM_META: tuple[tuple[str, DataType, bool], ...] = (
    ("stream", StringType(), False),
    ("offset", LongType(), False),
    *MESSAGE_FIELDS,
    ("content_type", StringType(), True),
    ("timestamp", TimestampType(), True),
)
"""Columns every row of the stream source has: the partition stream and the record's
offset in it ((stream, offset) is unique and stable across replays), the AMQP 1.0
message-id, the body, the application properties as text, the content type, and the
time the broker wrote the record's chunk."""

META_NAMES = tuple(n for n, _t, _n in STREAM_META)
_AMQP10 = b"\x00\x53"  # an AMQP 1.0 section descriptor: how an encoded message begins


@dataclass(slots=True)
class Record:
    """One stream record, decoded."""

    stream: str
    offset: int
    message_id: str | None
    body: bytes
    headers: dict[str, str] | None
    content_type: str | None
    timestamp_ms: int
    parsed: dict[str, Any] | None = None
    error: str | None = None
    """Why the body does not validate against the model (None: it does, or no model)."""


def _text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def _body(msg: amqp10.Message) -> bytes:
    """The body column: the data sections; or an amqp-value that is text or binary as
    its bytes, and any other amqp-value or amqp-sequence as JSON text; or empty."""
    if msg.body is not None:
        return msg.body
    value = msg.value
    if value is None:
        return b""
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    return header_text(value).encode()


def record(
    stream: str,
    offset: int,
    timestamp_ms: int,
    data: bytes,
    model: type[BaseModel] | None,
) -> Record:
    """A record from its stored bytes (validated against `model` when given)."""
    message_id = content_type = None
    headers: dict[str, str] | None = None
    body = data
    msg = amqp10.read(data) if data[:2] == _AMQP10 else None
    if msg is not None:  # else not an AMQP 1.0 message: a body without properties
        body = _body(msg)
        message_id = _text(msg.message_id)
        content_type = _text(msg.content_type)
        if msg.application_properties:
            headers = {k: header_text(v) for k, v in msg.application_properties.items()}
    parsed, error = decode(model, body)
    return Record(
        stream, offset, message_id, body, headers, content_type, timestamp_ms, parsed, error
    )


class StreamRowSchema(SourceSchema):
    """The stream source's Spark schema and the Arrow form of its rows."""

    def __init__(self, model: type[BaseModel] | None = None) -> None:
        super().__init__(STREAM_META, model, META_NAMES)

    def batch(self, records: Sequence[Record]) -> pa.RecordBatch:
        """Arrow rows of `records` (valid ones: invalid records never become rows)."""
        cols: list[Any] = [
            [r.stream for r in records],
            pa.array([r.offset for r in records], pa.int64()),
            [r.message_id for r in records],
            [r.body for r in records],
            [r.headers for r in records],
            [r.content_type for r in records],
            _timestamps([r.timestamp_ms * 1000 for r in records]),
        ]
        cols += self.model_values([r.parsed for r in records])
        return arrow_batch(cols, self.arrow)
