"""The Spark source's parts without Spark or a broker: options, schema, write-ahead log, IPC."""

from __future__ import annotations

import datetime as dt
import enum
import pickle
import secrets
import threading
from pathlib import Path
from typing import Literal

import pyarrow as pa
import pytest
from pydantic import BaseModel

pytest.importorskip("pyspark")

from ackkit.spark import (
    KeyFrom,
    OnInvalid,
    RowSchema,
    SourceOptions,
    WalError,
    batch_offsets,
    model_path,
)
from ackkit.spark._checkpoint import committed_end
from ackkit.spark._ipc import IpcServer, RunnerUnreachable, request
from ackkit.spark._options import ipc_address
from ackkit.spark._schema import KEY_COLUMN, RowMeta, load_model
from ackkit.spark._store import Store, child_location, masked, normalize_location
from ackkit.spark._wal import WriteAheadLog

pytestmark = [pytest.mark.spark, pytest.mark.one_leg]


class Color(str, enum.Enum):
    RED = "red"
    BLUE = "blue"


class Line(BaseModel):
    sku: str
    qty: int


class Sample(BaseModel):
    name: str
    price: float
    when: dt.datetime
    color: Color
    tier: Literal["a", "b"]
    lines: list[Line]
    tags: dict[str, int] = {}
    note: str | None = None


def meta(i: int) -> RowMeta:
    return RowMeta(f"m{i}", b"{}", {"h": "v"}, "rk", "", False, 1, "application/json", None)


def test_options_require_url_queue_checkpoint(tmp_path: Path):
    with pytest.raises(ValueError, match="checkpoint"):
        SourceOptions.parse({"url": "amqp://x", "queue": "q"})
    with pytest.raises(ValueError, match="unknown"):
        SourceOptions.parse({"url": "amqp://x", "queue": "q", "checkpoint": "/c", "batch": "9"})


def test_batch_is_capped_by_prefetch_so_it_can_always_fill(tmp_path: Path):
    o = SourceOptions.parse(
        {
            "url": "amqp://localhost/",
            "queue": "q",
            "checkpoint": str(tmp_path),
            "max_batch": "5000",
            "prefetch": "300",
        }
    )
    assert (o.max_batch, o.prefetch) == (300, 300)
    o = SourceOptions.parse(
        {
            "url": "amqp://localhost/",
            "queue": "q",
            "checkpoint": str(tmp_path),
            "max_batch": "40000",
        }
    )
    assert o.prefetch == 65535 and o.max_batch == 40000
    o = SourceOptions.parse(
        {
            "url": "amqp://localhost/",
            "queue": "q",
            "checkpoint": f"file://{tmp_path}",
            "on_invalid": "DEAD_LETTER",
            "key": "body",
        }
    )
    assert o.checkpoint == str(tmp_path.resolve())
    assert (o.on_invalid, o.key) == (OnInvalid.DEAD_LETTER, KeyFrom.BODY)
    # Object-store checkpoints are taken; the log goes inside them, a URI's query kept.
    s3 = SourceOptions.parse(
        {
            "url": "amqp://localhost/",
            "queue": "q",
            "checkpoint": "s3a://bucket/ck/?endpoint_override=h:9",
        }
    )
    assert s3.checkpoint == "s3a://bucket/ck?endpoint_override=h:9"
    assert s3.wal_dir.startswith("s3a://bucket/ck/ackkit/q-")
    assert s3.wal_dir.endswith("?endpoint_override=h:9")
    with pytest.raises(ValueError, match="nosuch"):
        SourceOptions.parse(
            {"url": "amqp://localhost/", "queue": "q", "checkpoint": "nosuch://bucket/ck"}
        )


def test_model_fields_become_typed_columns():
    rs = RowSchema(Sample)
    types = {f.name: f.dataType.simpleString() for f in rs.spark.fields}
    assert types["seq"] == "bigint"
    assert types["headers"] == "map<string,string>"
    assert types["price"] == "double"
    assert types["when"] == "timestamp"
    assert types["color"] == "string"
    assert types["lines"] == "array<struct<sku:string,qty:bigint>>"
    assert types["tags"] == "map<string,bigint>"
    nullable = {f.name: f.nullable for f in rs.spark.fields}
    assert nullable["note"] and nullable["tags"] and not nullable["name"]


def test_an_executor_reads_a_batch_without_the_model_module(tmp_path: Path):
    # An executor reads every batch from the write-ahead log on a pickled copy of the reader.
    # The model's module may exist only on the driver host (seen on a standalone cluster:
    # the replay failed with "No module named ..." while normal batches ran).
    from ackkit.spark import RabbitMQStreamReader

    rs = RowSchema(Sample)
    s = Sample(
        name="x",
        price=1.5,
        when=dt.datetime(2026, 1, 1, tzinfo=dt.UTC),
        color=Color.RED,
        tier="a",
        lines=[Line(sku="s", qty=2)],
    )
    missing = "ackkit_no_such_module:Sample"
    options = {"url": "amqp://x", "queue": "q", "checkpoint": str(tmp_path), "model": missing}
    reader = RabbitMQStreamReader(options)
    wal = WriteAheadLog(reader.opts.wal_dir)
    logged = rs.batch(0, [meta(1), meta(2)], [s.model_dump(), s.model_dump()], ["m1", "m2"])
    wal.write(0, 2, logged)
    on_executor = pickle.loads(pickle.dumps(reader))
    with pytest.raises(ImportError):
        load_model(missing)
    (part,) = reader.partitions({"ackkit": "q", "seq": 0}, {"ackkit": "q", "seq": 2})
    got = list(on_executor.read(pickle.loads(pickle.dumps(part))))
    assert len(got) == 1 and got[0].equals(rs.rows(logged))
    assert got[0].schema.equals(rs.arrow)


def test_rows_convert_to_the_exact_arrow_schema_spark_expects():
    rs = RowSchema(Sample)
    s = Sample(
        name="x",
        price=1.5,
        when=dt.datetime(2026, 1, 1, tzinfo=dt.UTC),
        color=Color.RED,
        tier="a",
        lines=[Line(sku="s", qty=2)],
    )
    wal = rs.batch(10, [meta(1), meta(2)], [s.model_dump(), s.model_dump()], ["m1", None])
    assert wal.column("seq").to_pylist() == [11, 12]
    assert wal.column(KEY_COLUMN).to_pylist() == ["m1", None]
    rows = rs.rows(wal)
    assert rows.schema.equals(rs.arrow)
    assert rows.column("color").to_pylist() == ["red", "red"]
    assert rows.column("lines").to_pylist()[0] == [{"sku": "s", "qty": 2}]


def test_model_field_may_not_shadow_a_source_column():
    class Bad(BaseModel):
        body: str

    with pytest.raises(ValueError, match="clashes"):
        RowSchema(Bad)


def test_model_path_round_trips():
    from spark.orders_pipeline import Order

    assert load_model(model_path(Order)) is Order
    with pytest.raises(ValueError):
        load_model("no_colon")


def test_wal_write_read_prune(tmp_path: Path):
    rs = RowSchema()
    wal = WriteAheadLog(tmp_path / "wal")
    wal.write(0, 2, rs.batch(0, [meta(1), meta(2)], [None, None], ["a", "b"]))
    wal.write(2, 3, rs.batch(2, [meta(3)], [None], ["c"]))
    assert wal.batches() == [(0, 2), (2, 3)]
    assert wal.keys(0, 3, KEY_COLUMN) == ["a", "b", "c"]
    assert [b.num_rows for b in wal.read(2, 3)] == [1]
    with pytest.raises(WalError):
        list(wal.read(1, 3))
    with pytest.raises(WalError):
        list(wal.read(3, 9))
    assert wal.written_upto() == 0
    wal.set_written_upto(3)
    assert wal.written_upto() == 3
    assert wal.prune(3, keep=1) == [(0, 2)]
    assert wal.batches() == [(2, 3)]
    assert not [p for p in (tmp_path / "wal").iterdir() if p.name.startswith(".tmp")]


def test_batch_offsets_reads_spark_offset_log(tmp_path: Path):
    (tmp_path / "offsets").mkdir()
    (tmp_path / "offsets" / "7").write_text(
        'v1\n{"batchWatermarkMs":0,"conf":{}}\n{"ackkit": "orders", "seq": 1200}\n-\n'
        '{"logOffset": 3}\n'
    )
    assert batch_offsets(tmp_path, 7) == [("orders", 1200)]
    from ackkit.spark import AckFailed

    with pytest.raises(AckFailed, match="checkpointLocation"):
        batch_offsets(tmp_path, 8)


def test_ipc_round_trip_and_unreachable_runner(tmp_path: Path):
    addr = ipc_address(tmp_path, "q-ipc-test")
    server = IpcServer(addr, lambda req: {"ok": True, "echo": req["n"] * 2})
    server.start()
    try:
        results = []
        threads = [
            threading.Thread(target=lambda i=i: results.append(request(addr, {"n": i}, 5.0)))
            for i in range(5)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(r["echo"] for r in results) == [0, 2, 4, 6, 8]
    finally:
        server.close()
    with pytest.raises(RunnerUnreachable):
        request(addr, {"n": 1}, 0.3)


def test_arrow_batch_of_no_model_rows_has_null_parsed_columns():
    rs = RowSchema()
    b = rs.rows(rs.batch(0, [meta(1)], [None], [None]))
    assert b.num_rows == 1
    assert b.schema.field("seq").type == pa.int64()


def test_committed_end_is_the_newest_committed_batch_of_the_queue(tmp_path: Path):
    from ackkit.spark._checkpoint import committed_end

    assert committed_end(tmp_path, "orders") == 0
    (tmp_path / "offsets").mkdir()
    (tmp_path / "commits").mkdir()
    for i, seq in enumerate((100, 250, 400)):
        (tmp_path / "offsets" / str(i)).write_text(
            f'v1\n{{}}\n{{"ackkit": "orders", "seq": {seq}}}\n{{"ackkit": "other", "seq": 7}}\n'
        )
    (tmp_path / "commits" / "0").write_text("v1\n{}\n")
    (tmp_path / "commits" / "1").write_text("v1\n{}\n")  # batch 2 is planned, not committed
    assert committed_end(tmp_path, "orders") == 250
    assert committed_end(tmp_path, "other") == 7
    assert committed_end(tmp_path, "missing") == 0


def test_wal_on_s3_writes_whole_objects_once_and_reads_them_back(s3_base: str):
    rs = RowSchema()
    loc = child_location(s3_base, f"wal-{secrets.token_hex(3)}")
    wal = WriteAheadLog(loc, cache=True)
    wal.create()
    wal.write(0, 2, rs.batch(0, [meta(1), meta(2)], [None, None], ["a", "b"]))
    wal.write(2, 3, rs.batch(2, [meta(3)], [None], ["c"]))
    # Another reader (an executor) lists the store itself and sees the same batches.
    other = WriteAheadLog(loc)
    assert other.batches() == wal.batches() == [(0, 2), (2, 3)]
    assert other.keys(0, 3, KEY_COLUMN) == ["a", "b", "c"]
    for end in (2, 3, 5):
        wal.set_written_upto(end)
    assert other.written_upto() == 5
    names = Store(loc).names()
    # Write-once names only: no temporary objects, old markers pruned.
    assert sorted(n for n in names if n.startswith("written-")) == [
        f"written-{e:020d}" for e in (3, 5)
    ]
    assert not [n for n in names if n.startswith(".")]
    assert wal.prune(3, keep=1) == [(0, 2)]
    assert other.batches() == [(2, 3)]


def test_spark_checkpoint_files_are_read_through_the_store(s3_base: str):
    ck = child_location(s3_base, f"ck-{secrets.token_hex(3)}")
    store = Store(ck)
    store.child("offsets").put(
        "4", b'v1\n{"batchWatermarkMs":0}\n{"ackkit": "a", "seq": 40}\n{"ackkit": "b", "seq": 7}\n'
    )
    store.child("offsets").put(
        "5", b'v1\n{}\n{"ackkit": "a", "seq": 90}\n{"ackkit": "b", "seq": 7}\n'
    )
    store.child("commits").put("4", b"v1\n{}\n")
    assert batch_offsets(ck, 5) == [("a", 90), ("b", 7)]
    assert committed_end(ck, "a") == 40  # batch 5 is not committed
    assert committed_end(ck, "c") == 0


def test_locations_keep_their_query_and_mask_secrets():
    loc = "s3a://key:secret@bucket/ck/?endpoint_override=h:9000&scheme=http"
    assert (
        normalize_location(loc) == "s3a://key:secret@bucket/ck?endpoint_override=h:9000&scheme=http"
    )
    assert child_location(normalize_location(loc), "ackkit", "q").endswith(
        "/ck/ackkit/q?endpoint_override=h:9000&scheme=http"
    )
    assert "secret" not in masked(loc)


def test_a_store_refusing_deletes_does_not_stop_the_log(tmp_path: Path, monkeypatch, caplog):
    rs = RowSchema()
    wal = WriteAheadLog(tmp_path / "wal", cache=True)
    for i in range(3):
        wal.write(i, i + 1, rs.batch(i, [meta(i)], [None], [f"k{i}"]))

    def refuse(self: Store, name: str) -> None:
        raise OSError("AccessDenied (test)")

    monkeypatch.setattr(Store, "delete", refuse)
    for end in (1, 2, 3, 4):
        wal.set_written_upto(end)  # old markers stay; the new one is written
    assert wal.written_upto() == 4
    assert wal.prune(3, keep=1) == []  # nothing could be deleted: nothing reported
    assert wal.batches() == [(0, 1), (1, 2), (2, 3)]
    assert "cannot delete" in caplog.text


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({}, "needs queue="),
        ({"queue": "a", "queues": ["b"]}, "not both"),
        ({"queues": "ab"}, "list"),
        ({"queues": []}, "distinct"),
        ({"queues": ["a", "a"]}, "distinct"),
        ({"exchange": "x"}, "together"),
        ({"shards": 2}, "together"),
        ({"exchange": "x", "shards": 2, "queue": "a"}, "together"),
    ],
)
def test_read_stream_refuses_unclear_queue_arguments_before_touching_spark(kwargs, message):
    from ackkit.spark import read_stream

    with pytest.raises((ValueError, TypeError), match=message):
        read_stream(object(), url="amqp://x", checkpoint="/tmp/ck", **kwargs)
