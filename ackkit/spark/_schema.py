"""The rows the source yields: metadata columns, parsed model fields, Arrow batches."""

from __future__ import annotations

import datetime as _dt
import decimal
import enum
import json
import types
import typing
import uuid
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pydantic import BaseModel
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

KEY_COLUMN = "_ackkit_key"
"""Extra column of write-ahead-log files: the deduplication key of each row."""

MESSAGE_FIELDS: tuple[tuple[str, DataType, bool], ...] = (
    ("message_id", StringType(), True),
    ("body", BinaryType(), True),
    ("headers", MapType(StringType(), StringType(), True), True),
)
"""Columns both sources give each row: the message id, the body, the headers as text."""

META_FIELDS: tuple[tuple[str, DataType, bool], ...] = (
    ("seq", LongType(), False),
    *MESSAGE_FIELDS,
    ("routing_key", StringType(), True),
    ("exchange", StringType(), True),
    ("redelivered", BooleanType(), False),
    ("attempt", IntegerType(), False),
    ("content_type", StringType(), True),
    ("timestamp", TimestampType(), True),
)
"""Columns every row has, in order: the message's offset in the stream (`seq`, stable
across replays), the AMQP properties a pipeline needs, and the 1-based attempt."""

META_NAMES = tuple(n for n, _t, _n in META_FIELDS)

Converter = Callable[[Any], Any]


@dataclass(slots=True)
class RowMeta:
    """What the source keeps of one delivery besides the parsed body.

    Not frozen: built once per delivery on the consumer's I/O thread, and a frozen
    dataclass's `__init__` (one `object.__setattr__` per field) costs about six times
    as much. Nothing changes it after it is built."""

    message_id: str | None
    body: bytes
    headers: dict[str, str] | None
    routing_key: str
    exchange: str
    redelivered: bool
    attempt: int
    content_type: str | None
    timestamp: int | None
    """The AMQP timestamp property: seconds since the epoch."""


def load_model(path: str) -> type[BaseModel]:
    """Import a pydantic model from "package.module:ClassName"."""
    import importlib

    mod_name, sep, attr = path.partition(":")
    if not sep or not mod_name or not attr:
        raise ValueError(f"model must be given as 'package.module:ClassName', not {path!r}")
    obj: Any = importlib.import_module(mod_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    if not (isinstance(obj, type) and issubclass(obj, BaseModel)):
        raise TypeError(f"{path} is not a pydantic BaseModel subclass")
    return obj


def model_path(model: type[BaseModel]) -> str:
    """The "module:Class" string of an importable model (the form the source option takes).

    A model of a script run with `python -m pkg.mod` is found as pkg.mod; one of a plain
    script (`python file.py`) cannot be imported by Spark's Python workers.
    """
    import sys

    module = model.__module__
    if module == "__main__":
        spec = getattr(sys.modules["__main__"], "__spec__", None)
        if spec is None or not spec.name or spec.name == "__main__":
            raise ValueError(
                f"{model.__qualname__} is defined in a script: Spark's Python workers cannot "
                "import it. Move it to a module (or run the script with python -m)."
            )
        module = spec.name
    return f"{module}:{model.__qualname__}"


# -- Spark types of model fields ------------------------------------------------------


def _unwrap_optional(tp: Any) -> tuple[Any, bool]:
    origin = typing.get_origin(tp)
    if origin is typing.Union or origin is types.UnionType:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0], True
        raise TypeError(f"unions other than Optional[X] have no Spark type: {tp!r}")
    return tp, False


def spark_type(tp: Any) -> tuple[DataType, bool]:
    """The Spark type of a field annotation, and whether it is nullable."""
    tp, nullable = _unwrap_optional(tp)
    origin = typing.get_origin(tp)
    if origin is typing.Annotated:
        return spark_type(typing.get_args(tp)[0])
    if origin is typing.Literal:
        values = typing.get_args(tp)
        if all(isinstance(v, str) for v in values):
            return StringType(), nullable
        if all(isinstance(v, int) and not isinstance(v, bool) for v in values):
            return LongType(), nullable
        raise TypeError(f"mixed Literal has no Spark type: {tp!r}")
    if origin in (list, tuple, set, frozenset, Sequence, typing.Sequence):
        args = typing.get_args(tp)
        if not args or (origin is tuple and not (len(args) == 2 and args[1] is Ellipsis)):
            raise TypeError(f"only homogeneous sequences have a Spark type: {tp!r}")
        inner, inner_null = spark_type(args[0])
        return ArrayType(inner, inner_null), nullable
    if origin in (dict, Mapping, typing.Mapping):
        k, v = typing.get_args(tp) or (str, str)
        kt, _ = spark_type(k)
        vt, v_null = spark_type(v)
        return MapType(kt, vt, v_null), nullable
    if isinstance(tp, type):
        if issubclass(tp, BaseModel):
            return model_struct(tp), nullable
        if issubclass(tp, bool):
            return BooleanType(), nullable
        if issubclass(tp, enum.Enum):
            if issubclass(tp, int):
                return LongType(), nullable
            return StringType(), nullable
        if issubclass(tp, int):
            return LongType(), nullable
        if issubclass(tp, float):
            return DoubleType(), nullable
        if issubclass(tp, decimal.Decimal):
            return DecimalType(38, 18), nullable
        if issubclass(tp, str | uuid.UUID):
            return StringType(), nullable
        if issubclass(tp, bytes):
            return BinaryType(), nullable
        if issubclass(tp, _dt.datetime):
            return TimestampType(), nullable
        if issubclass(tp, _dt.date):
            return DateType(), nullable
    raise TypeError(f"no Spark type for model field type {tp!r}")


def model_struct(model: type[BaseModel]) -> StructType:
    fields = []
    for name, info in model.model_fields.items():
        dtype, nullable = spark_type(info.annotation)
        fields.append(StructField(name, dtype, nullable or not info.is_required()))
    return StructType(fields)


def _converter(tp: Any) -> Converter | None:
    """How to turn a model_dump() value into what pyarrow takes; None: as is."""
    tp, _ = _unwrap_optional(tp)
    origin = typing.get_origin(tp)
    if origin is typing.Annotated:
        return _converter(typing.get_args(tp)[0])
    if origin in (list, tuple, set, frozenset, Sequence, typing.Sequence):
        inner = _converter(typing.get_args(tp)[0])
        if inner is None and origin is list:
            return None
        return lambda v: None if v is None else [_apply(inner, x) for x in v]
    if origin in (dict, Mapping, typing.Mapping):
        k, v = typing.get_args(tp) or (str, str)
        kc, vc = _converter(k), _converter(v)
        if kc is None and vc is None:
            return None
        return lambda d: None if d is None else {_apply(kc, a): _apply(vc, b) for a, b in d.items()}
    if isinstance(tp, type):
        if issubclass(tp, BaseModel):
            convs = {n: _converter(i.annotation) for n, i in tp.model_fields.items()}
            if all(c is None for c in convs.values()):
                return None
            return lambda d: None if d is None else {n: _apply(convs[n], d[n]) for n in convs}
        if issubclass(tp, enum.Enum):
            return lambda v: None if v is None else v.value
        if issubclass(tp, uuid.UUID):
            return lambda v: None if v is None else str(v)
    return None


def _apply(conv: Converter | None, v: Any) -> Any:
    return v if conv is None else conv(v)


# -- the row schema ---------------------------------------------------------------------


def model_columns(
    model: type[BaseModel] | None, reserved: Collection[str]
) -> list[tuple[StructField, Converter | None]]:
    """The model's fields as a source's columns, each with its value converter; a field
    named like one of the source's own columns (`reserved`) is refused."""
    if model is None:
        return []
    out = []
    for f in model_struct(model).fields:
        if f.name in reserved:
            raise ValueError(
                f"{model.__name__}.{f.name} clashes with the source's column {f.name!r}; "
                "rename the field (pydantic aliases keep the JSON name)"
            )
        out.append((f, _converter(model.model_fields[f.name].annotation)))
    return out


class SourceSchema:
    """A source's Spark schema, its own columns (`meta`) followed by the model's fields,
    and the Arrow form of both; the base of each source's row schema."""

    def __init__(
        self,
        meta: Sequence[tuple[str, DataType, bool]],
        model: type[BaseModel] | None,
        reserved: Collection[str],
    ) -> None:
        self.model = model
        columns = model_columns(model, reserved)
        self.model_fields = [f.name for f, _c in columns]
        """The model's field names, in column order (after the source's own)."""
        self._convs: list[Converter | None] = [c for _f, c in columns]
        own = [StructField(n, t, nullable) for n, t, nullable in meta]
        self.spark = StructType(own + [f for f, _c in columns])
        self._timestamp_fields = {
            f.name for f, _c in columns if isinstance(f.dataType, TimestampType)
        }
        self.arrow = to_arrow_schema(self.spark, timezone="UTC")

    def model_values(self, parsed: Sequence[dict[str, Any] | None]) -> list[Any]:
        """The model's columns of rows whose bodies parsed to `parsed` (None: a row
        without a model, all its fields null), each as pyarrow takes it."""
        cols: list[Any] = []
        for name, conv in zip(self.model_fields, self._convs, strict=True):
            values = [None if p is None else p.get(name) for p in parsed]
            if conv is not None:
                values = [conv(v) for v in values]
            if name in self._timestamp_fields:
                cols.append(_timestamps([_micros(v) for v in values]))
            else:
                cols.append(values)
        return cols


def arrow_batch(cols: Sequence[Any], schema: pa.Schema) -> pa.RecordBatch:
    """A record batch of `schema` from its columns: Arrow arrays as they are, Python
    lists converted to each field's type."""
    arrays = [
        c if isinstance(c, pa.Array) else pa.array(c, type=f.type)
        for c, f in zip(cols, schema, strict=True)
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


class RowSchema(SourceSchema):
    """The source's Spark schema and the Arrow form of its batches."""

    def __init__(self, model: type[BaseModel] | None = None) -> None:
        super().__init__(META_FIELDS, model, (*META_NAMES, KEY_COLUMN))
        self.wal_arrow = self.arrow.append(pa.field(KEY_COLUMN, pa.string()))

    def ddl(self) -> str:
        return str(self.spark.simpleString())

    def batch(
        self,
        start: int,
        metas: Sequence[RowMeta],
        parsed: Sequence[dict[str, Any] | None],
        keys: Sequence[str | None],
    ) -> pa.RecordBatch:
        """The write-ahead-log form of a batch: the rows plus their keys, seq from start + 1."""
        n = len(metas)
        cols: list[Any] = [
            pa.array(range(start + 1, start + 1 + n), pa.int64()),
            [m.message_id for m in metas],
            [m.body for m in metas],
            [m.headers for m in metas],
            [m.routing_key for m in metas],
            [m.exchange for m in metas],
            [m.redelivered for m in metas],
            [m.attempt for m in metas],
            [m.content_type for m in metas],
            _timestamps([None if m.timestamp is None else m.timestamp * 1_000_000 for m in metas]),
        ]
        cols += self.model_values(parsed)
        cols.append(list(keys))
        return arrow_batch(cols, self.wal_arrow)

    def rows(self, wal_batch: pa.RecordBatch) -> pa.RecordBatch:
        """A write-ahead-log batch as Spark takes it (without the key column)."""
        return pa.RecordBatch.from_arrays(
            [wal_batch.column(i) for i in range(len(self.arrow))], schema=self.arrow
        )


_EPOCH = _dt.datetime(1970, 1, 1, tzinfo=_dt.UTC)
_MICRO = _dt.timedelta(microseconds=1)
_TS = pa.timestamp("us", tz="UTC")


def _micros(v: _dt.datetime | None) -> int | None:
    """Microseconds since the epoch; a naive datetime is taken as UTC (as Arrow does)."""
    if v is None:
        return None
    if v.tzinfo is None:
        v = v.replace(tzinfo=_dt.UTC)
    return (v - _EPOCH) // _MICRO


def _timestamps(micros: list[int | None]) -> pa.Array:
    # Built from integers: converting datetime objects makes pyarrow import pandas
    # (most of a second in a fresh process) and is slower.
    return pa.array(micros, pa.int64()).view(_TS)


def header_text(value: Any) -> str:
    """A header value as text: bytes decoded as UTF-8, tables and lists as JSON."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, str):
        return value
    if isinstance(value, (dict, list, tuple)):
        return json.dumps(value, default=str, sort_keys=True)
    if isinstance(value, decimal.Decimal):
        return str(value)
    return str(value)
