"""A deployment changes between restarts: what the output and the broker show.

Three queries are killed (SIGKILL of their driver after writing a batch, before its
ack), then restarted with a change: the queues given in another order, a second
checkpoint on the first one's write-ahead log, another shard count. Two more run in this
process: queues added and removed under Spark's named sources, a queue deleted under a
running query, a second query on a queue already read. Every time the output holds each
published order exactly once and the broker's queues end empty, or the change is refused
with an error that says what to do and leaves the broker as it was.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pika
import pytest

pytest.importorskip("pyspark")

from _spark_deploy_query import start

import ackkit.spark as aks
from ackkit.spark._faults import ENV
from ackkit.spark._wal import WriteAheadLog
from spark.orders_pipeline import publish_orders, wait_until_drained

pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.timeout(900)]

N = 200
DRIVER = Path(__file__).with_name("_spark_deploy_driver.py")
CRASH = "after_write:2"  # batch 2 written, not acked: its messages come back


def exists(url: str, queue: str) -> bool:
    conn = pika.BlockingConnection(pika.URLParameters(url))
    try:
        conn.channel().queue_declare(queue, passive=True)
        return True
    except pika.exceptions.ChannelClosedByBroker as exc:
        assert exc.reply_code == 404
        return False
    finally:
        if conn.is_open:
            conn.close()


def output(spark: Any, base: Path, ck: str = "ck") -> list[str]:
    out = base / f"out-{ck}"
    if not out.exists():
        return []
    return [r["message_id"] for r in spark.read.parquet(str(out)).select("message_id").collect()]


def failure(query: Any, timeout: float) -> str:
    """The error the query failed with (it must fail within `timeout`)."""
    deadline = time.monotonic() + timeout
    while query.isActive:
        if time.monotonic() > deadline:
            query.stop()
            raise AssertionError(f"the query did not fail within {timeout:.0f} s")
        time.sleep(0.5)
    exc = query.exception()
    assert exc is not None, "the query stopped without an error"
    return str(exc)


def drain(query: Any, url: str, queues: list[str], ck: Path, timeout: float = 240) -> None:
    try:
        wait_until_drained(query, url=url, queue=queues, checkpoint=ck, timeout=timeout)
    finally:
        query.stop()


def settled(rabbitmq: Any, queues: list[str]) -> list[tuple[int, int]]:
    return [(c.ready, c.unacked) for c in (rabbitmq.counts(q) for q in queues)]


@dataclass
class Killed:
    base: Path
    spec: dict[str, Any]
    good: list[str]
    queues: list[str]
    returncode: int
    log: str


def _publish(url: str, queues: list[str], n: int, first: int = 0) -> list[str]:
    good: list[str] = []
    for i, q in enumerate(queues):
        good += publish_orders(url, q, n, start=first + i * 100_000)[0]
    return good


@pytest.fixture(scope="module")
def killed(amqp_url: str, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Run each scenario's driver (all at once) until it kills itself; yield them."""
    tag = secrets.token_hex(3)
    specs: dict[str, tuple[dict[str, Any], list[str], list[str]]] = {}
    # reorder: two queues, restarted below with queues= in the other order
    qa, qb = f"t.deploy.{tag}.a", f"t.deploy.{tag}.b"
    base = tmp_path_factory.mktemp("deploy-reorder")
    # (b much shorter, so that the two queues' offsets differ when the driver dies)
    specs["reorder"] = (
        {"queues": [qa, qb], "base": str(base)},
        [qa, qb],
        _publish(amqp_url, [qa], N) + _publish(amqp_url, [qb], 30, first=100_000),
    )
    # wal: the write-ahead log outside the checkpoint, later claimed by a new checkpoint
    qw = f"t.deploy.{tag}.wal"
    base = tmp_path_factory.mktemp("deploy-wal")
    spec = {"queues": [qw], "base": str(base), "wal_location": str(base / "shared-wal")}
    specs["wal"] = (spec, [qw], _publish(amqp_url, [qw], N))
    # shards: two consistent-hash shards, restarted below with shards=4 then 2
    ex = f"t.deploy.{tag}.ex"
    layout = aks.declare_shards(amqp_url, ex, 2, kind=aks.ShardKind.CONSISTENT)
    base = tmp_path_factory.mktemp("deploy-shards")
    good = publish_orders(amqp_url, ex, 2 * N, layout=layout)[0]
    specs["shards"] = ({"exchange": ex, "shards": 2, "base": str(base)}, list(layout.queues), good)

    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, **{ENV: CRASH})
    only = os.environ.get("ACKKIT_SPARK_DEPLOY_ONLY", "")  # e.g. "reorder" while developing
    every = dict(specs)
    specs = {name: s for name, s in specs.items() if only in name}
    procs = {}
    for name, (spec, _q, _g) in specs.items():
        logf = open(Path(spec["base"]) / "driver.log", "wb")  # noqa: SIM115 - closed below
        spec["url"] = amqp_url
        procs[name] = (
            subprocess.Popen(
                [sys.executable, str(DRIVER), json.dumps(spec)],
                env=env,
                stdout=logf,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            ),
            logf,
        )
    out = {}
    deadline = time.monotonic() + 300
    try:
        for name, (proc, logf) in procs.items():
            try:
                rc = proc.wait(timeout=max(deadline - time.monotonic(), 1))
            except subprocess.TimeoutExpired:
                rc = -999
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # the JVM and the runners too
            logf.close()
            spec, queues, good = specs[name]
            text = (Path(spec["base"]) / "driver.log").read_text(errors="replace")[-3000:]
            out[name] = Killed(Path(spec["base"]), spec, good, queues, rc, text)
        yield out
    finally:
        for proc, logf in procs.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            logf.close()
        conn = pika.BlockingConnection(pika.URLParameters(amqp_url))
        try:
            ch = conn.channel()
            for _spec, queues, _g in every.values():
                for q in [*queues, f"{ex}.shard-2", f"{ex}.shard-3"]:
                    ch.queue_delete(q)
                    ch.queue_delete(f"{q}.dlq")
            ch.exchange_delete(ex)
        finally:
            conn.close()


def _was_killed(killed: dict[str, Killed], name: str) -> Killed:
    if name not in killed:
        pytest.skip("not run: ACKKIT_SPARK_DEPLOY_ONLY")
    k = killed[name]
    assert k.returncode == -signal.SIGKILL, f"driver did not die at {CRASH}:\n{k.log}"
    return k


def test_queues_in_another_order_after_a_kill_write_every_row_once(
    killed, spark, amqp_url, rabbitmq
):
    k = _was_killed(killed, "reorder")
    before = output(spark, k.base)
    assert 0 < len(before) < len(k.good)
    qa, qb = k.queues
    query = start(spark, amqp_url, k.base, queues=[qb, qa])  # the other order
    drain(query, amqp_url, k.queues, k.base / "ck")
    ids = output(spark, k.base)
    assert len(ids) == len(set(ids)), f"{len(ids) - len(set(ids))} duplicates"
    assert sorted(ids) == sorted(k.good)
    assert settled(rabbitmq, k.queues) == [(0, 0), (0, 0)]

    # Adding or removing a queue on this checkpoint: refused before the query starts.
    qc = f"{qa}.new"
    with pytest.raises(aks.DeploymentChanged, match=rf"adds '{qc}'.*own checkpoint"):
        start(spark, amqp_url, k.base, queues=[qa, qb, qc])
    with pytest.raises(aks.DeploymentChanged, match=rf"removes '{qb}'"):
        start(spark, amqp_url, k.base, queues=[qa])
    assert not exists(amqp_url, qc)
    # and the refused attempts changed nothing: a restart in yet another order reads on
    publish = _publish(amqp_url, [qa], 20, first=500_000)
    query = start(spark, amqp_url, k.base, queues=[qa, qb])
    drain(query, amqp_url, k.queues, k.base / "ck")
    assert sorted(output(spark, k.base)) == sorted(k.good + publish)


def test_a_second_checkpoint_on_the_write_ahead_log_is_refused_naming_both(
    killed, spark, amqp_url, rabbitmq
):
    k = _was_killed(killed, "wal")
    before = output(spark, k.base)
    assert 0 < len(before) < len(k.good)
    left = settled(rabbitmq, k.queues)[0][0]
    wal_root = k.spec["wal_location"]
    # read_stream refuses before the query starts ...
    with pytest.raises(aks.DeploymentChanged) as refused:
        start(spark, amqp_url, k.base, ck="ck2", queues=k.queues, wal_location=wal_root)
    err = str(refused.value)
    assert "belongs to checkpoint" in err and str(k.base / "ck") in err
    assert str(k.base / "ck2") in err and "(new)" in err and "wal_location" in err
    assert not (k.base / "ck2").exists()
    # ... and a query built on format("rabbitmq") fails in its source runner.
    ck3 = k.base / "ck3"
    aks.register(spark)
    df = (
        spark.readStream.format(aks.FORMAT)
        .option("url", amqp_url)
        .option("queue", k.queues[0])
        .option("checkpoint", str(ck3))
        .option("wal_location", wal_root)
        .load()
    )
    acking = aks.ack_after_commit(aks.parquet_batches(k.base / "out-ck3"), checkpoint=ck3)
    query = (
        df.select("seq", "message_id")
        .writeStream.foreachBatch(acking)
        .option("checkpointLocation", str(ck3))
        .start()
    )
    err = failure(query, 120)
    assert "belongs to checkpoint" in err and str(k.base / "ck") in err
    assert str(ck3) in err and "wal_location" in err
    assert output(spark, k.base, "ck3") == []  # none of the old query's rows re-emitted
    assert settled(rabbitmq, k.queues) == [(left, 0)]  # nothing read, nothing acked
    # The first checkpoint still owns its log, and its restart finishes exactly once.
    wal = WriteAheadLog(
        aks.SourceOptions.parse(
            {
                "url": amqp_url,
                "queue": k.queues[0],
                "checkpoint": str(k.base / "ck"),
                "wal_location": wal_root,
            }
        ).wal_dir
    )
    owner = wal.owner()
    assert owner is not None and owner.checkpoint == str(k.base / "ck")
    query = start(spark, amqp_url, k.base, queues=k.queues, wal_location=wal_root)
    drain(query, amqp_url, k.queues, k.base / "ck")
    ids = output(spark, k.base)
    assert len(ids) == len(set(ids)) and sorted(ids) == sorted(k.good)
    assert settled(rabbitmq, k.queues) == [(0, 0)]


def _bound(rabbitmq: Any, exchange: str) -> set[str]:
    text = rabbitmq.ctl("list_bindings", "-p", "/", "source_name", "destination_name", "--quiet")
    return {
        parts[1]
        for line in text.splitlines()
        if len(parts := line.split("\t")) >= 2 and parts[0] == exchange
    }


def test_a_shard_count_change_is_refused_before_touching_the_broker(
    killed, spark, amqp_url, rabbitmq
):
    k = _was_killed(killed, "shards")
    ex = k.spec["exchange"]
    assert _bound(rabbitmq, ex) == set(k.queues)
    with pytest.raises(aks.DeploymentChanged, match=r"shards=2.*shards=4.*Nothing was declared"):
        start(spark, amqp_url, k.base, exchange=ex, shards=4)
    assert _bound(rabbitmq, ex) == set(k.queues)  # no exchange bound to new shard queues
    assert not exists(amqp_url, f"{ex}.shard-2") and not exists(amqp_url, f"{ex}.shard-3")
    query = start(spark, amqp_url, k.base, exchange=ex, shards=2)
    drain(query, amqp_url, k.queues, k.base / "ck")
    ids = output(spark, k.base)
    assert len(ids) == len(set(ids)) and sorted(ids) == sorted(k.good)
    assert settled(rabbitmq, k.queues) == [(0, 0), (0, 0)]


@pytest.fixture
def named_sources(spark: Any) -> Any:
    """Spark 4.2+ source evolution on for one test (the session is shared)."""
    spark.conf.set(aks.EVOLUTION, "true")
    try:
        yield
    finally:
        spark.conf.unset(aks.EVOLUTION)


def test_named_sources_add_remove_and_reorder_queues_losing_and_doubling_nothing(
    named_sources, spark, amqp_url, rabbitmq, queue_factory, tmp_path
):
    qa, qb, qc = (queue_factory(f"named-{x}") for x in "abc")
    good = _publish(amqp_url, [qa, qb], 60)
    drain(start(spark, amqp_url, tmp_path, queues=[qa, qb]), amqp_url, [qa, qb], tmp_path / "ck")
    more = _publish(amqp_url, [qa, qb, qc], 40, first=1000)
    # a removed (qa), b kept, c added, in another order: a keeps its messages for later
    drain(start(spark, amqp_url, tmp_path, queues=[qc, qb]), amqp_url, [qc, qb], tmp_path / "ck")
    assert settled(rabbitmq, [qa, qb, qc]) == [(40, 0), (0, 0), (0, 0)]
    drain(
        start(spark, amqp_url, tmp_path, queues=[qb, qc, qa]),
        amqp_url,
        [qa, qb, qc],
        tmp_path / "ck",
    )
    ids = output(spark, tmp_path)
    assert len(ids) == len(set(ids)) and sorted(ids) == sorted(good + more)
    assert settled(rabbitmq, [qa, qb, qc]) == [(0, 0)] * 3


def test_a_queue_deleted_under_the_query_fails_it_and_a_restart_reads_on(
    spark, amqp_url, rabbitmq, queue_factory, tmp_path
):
    q = queue_factory("deleted")
    good = _publish(amqp_url, [q], 50)
    query = start(spark, amqp_url, tmp_path, queues=[q])
    wait_until_drained(query, url=amqp_url, queue=q, checkpoint=tmp_path / "ck", timeout=180)
    conn = pika.BlockingConnection(pika.URLParameters(amqp_url))
    conn.channel().queue_delete(q)
    conn.close()
    err = failure(query, 60)
    assert f"queue '{q}' was deleted while the query read it" in err
    assert "Restart the query" in err
    # A restart declares the queue again and reads what is published to it now.
    query = start(spark, amqp_url, tmp_path, queues=[q])
    more = _publish(amqp_url, [q], 30, first=1000)
    drain(query, amqp_url, [q], tmp_path / "ck")
    ids = output(spark, tmp_path)
    assert len(ids) == len(set(ids)) and sorted(ids) == sorted(good + more)
    assert settled(rabbitmq, [q]) == [(0, 0)]


def test_a_second_query_on_a_queue_already_read_fails_clearly_the_first_reads_on(
    spark, amqp_url, rabbitmq, queue_factory, tmp_path
):
    q = queue_factory("taken")
    good = _publish(amqp_url, [q], 50)
    first = start(spark, amqp_url, tmp_path, queues=[q])
    try:
        wait_until_drained(first, url=amqp_url, queue=q, checkpoint=tmp_path / "ck", timeout=180)
        second = start(spark, amqp_url, tmp_path, ck="ck2", queues=[q], exclusive_wait_ms=4000)
        err = failure(second, 90)
        assert f"queue '{q}' has had another exclusive consumer" in err
        assert "another query" in err
        assert first.isActive
        more = _publish(amqp_url, [q], 30, first=1000)
    finally:
        drain(first, amqp_url, [q], tmp_path / "ck")
    ids = output(spark, tmp_path)
    assert len(ids) == len(set(ids)) and sorted(ids) == sorted(good + more)
    assert output(spark, tmp_path, "ck2") == []
    assert settled(rabbitmq, [q]) == [(0, 0)]


def test_shard_queues_left_by_a_larger_layout_are_refused_until_drained_and_deleted(
    spark, amqp_url, rabbitmq, tmp_path
):
    """4 shards read on one checkpoint, then shards=2 on a new one: refused while
    shard-2 and shard-3 exist (the exchange still routes to them), before anything is
    declared; drained with shards=4 and deleted, shards=2 reads every new message."""
    ex = f"t.deploy.{secrets.token_hex(3)}.shrink"
    four = list(aks.shard_queues(ex, 4))
    try:
        layout4 = aks.declare_shards(amqp_url, ex, 4, kind=aks.ShardKind.CONSISTENT)
        good = publish_orders(amqp_url, ex, 300, layout=layout4)[0]
        left = settled(rabbitmq, four[2:])
        assert all(ready > 0 for ready, _u in left)
        with pytest.raises(aks.DeploymentChanged) as e:
            start(spark, amqp_url, tmp_path, ck="ck2", exchange=ex, shards=2)
        msg = str(e.value)
        assert f"'{ex}.shard-2' ({left[0][0]} messages)" in msg
        assert f"'{ex}.shard-3' ({left[1][0]} messages)" in msg and "Nothing was declared" in msg
        assert settled(rabbitmq, four[2:]) == left  # untouched
        assert _bound(rabbitmq, ex) == set(four)
        assert not (tmp_path / "ck2").exists()  # the query never started
        # Drain them with the old count, delete the extra shards, then read 2.
        drain(
            start(spark, amqp_url, tmp_path, ck="ck4", exchange=ex, shards=4),
            amqp_url,
            four,
            tmp_path / "ck4",
        )
        conn = pika.BlockingConnection(pika.URLParameters(amqp_url))
        try:
            ch = conn.channel()
            for q in four[2:]:
                ch.queue_delete(q)
        finally:
            conn.close()
        query = start(spark, amqp_url, tmp_path, ck="ck2", exchange=ex, shards=2)
        layout2 = aks.ShardLayout(ex, 2, aks.ShardKind.CONSISTENT)
        more = publish_orders(amqp_url, ex, 100, start=10_000, layout=layout2)[0]
        drain(query, amqp_url, four[:2], tmp_path / "ck2")
        first, second = output(spark, tmp_path, "ck4"), output(spark, tmp_path, "ck2")
        assert len(first) == len(set(first)) and sorted(first) == sorted(good)
        assert len(second) == len(set(second)) and sorted(second) == sorted(more)
        assert settled(rabbitmq, four[:2]) == [(0, 0), (0, 0)]
        assert _bound(rabbitmq, ex) == set(four[:2])
    finally:
        conn = pika.BlockingConnection(pika.URLParameters(amqp_url))
        try:
            ch = conn.channel()
            for q in four:
                ch.queue_delete(q)
                ch.queue_delete(f"{q}.dlq")
            ch.exchange_delete(ex)
        finally:
            conn.close()
