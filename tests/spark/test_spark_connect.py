"""The rabbitmq queue source and the rabbitmq-stream source under Spark Connect: a local
server, the client in another process.

The server is the pyspark installation's own (`sbin/start-connect-server.sh --wait`,
the `spark-connect` jar in `pyspark/jars`), bound to 127.0.0.1 on a free port. The
client (`_spark_connect_client.py`) registers the Python data source over Connect,
runs a Trigger.AvailableNow query, and exits; what is asserted is what the broker
and the output show. Under Connect the query, the source runner and the foreachBatch
function all run on the server's host (the function in a Python process the server
starts), so ack_after_commit's local socket to the runner works as it does without
Connect.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _spark_support import wait_for

pytest.importorskip("pyspark")

import pyspark

from spark.orders_pipeline import publish_orders

pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]
CLIENT = Path(__file__).with_name("_spark_connect_client.py")
HOME = Path(pyspark.__file__).parent
N = 250
SLOW_WORKER = "Python worker failed to connect back"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env(extra_path: str = "") -> dict[str, str]:
    path = [str(ROOT), *(p for p in (extra_path, os.environ.get("PYTHONPATH", "")) if p)]
    return {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYTHONPATH": os.pathsep.join(path)}


@pytest.fixture(scope="module")
def connect_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A Spark Connect server on 127.0.0.1 (yields its sc:// address)."""
    if shutil.which("java") is None:
        pytest.skip("Spark tests need Java (a JRE 17 on PATH)")
    jars = sorted((HOME / "jars").glob("spark-connect_*.jar"))
    script = HOME / "sbin" / "start-connect-server.sh"
    if not jars or not script.exists():
        pytest.fail(f"this pyspark ({HOME}) ships no Spark Connect server (jar or script)")
    pytest.importorskip("grpc", reason="the Spark Connect client needs pyspark[connect]")
    logs = tmp_path_factory.mktemp("connect-server")
    port = _free_port()
    env = {**_env(), "SPARK_LOG_DIR": str(logs), "SPARK_PID_DIR": str(logs)}
    logf = open(logs / "server.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [
            "bash",
            str(script),
            "--wait",
            "--master",
            "local[2]",
            "--driver-memory",
            "1g",
            "--conf",
            "spark.connect.grpc.binding.address=127.0.0.1",
            "--conf",
            f"spark.connect.grpc.binding.port={port}",
            "--conf",
            "spark.ui.enabled=false",
            "--conf",
            "spark.python.authenticate.socketTimeout=120s",
            "--conf",
            "spark.sql.shuffle.partitions=2",
        ],
        env=env,
        stdout=logf,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 180
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
                break
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = (logs / "server.log").read_text(errors="replace")[-3000:]
                pytest.fail(f"the Spark Connect server did not start:\n{tail}")
            time.sleep(0.5)
        yield f"sc://127.0.0.1:{port}"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        logf.close()


def _ids(output: Path) -> list[str]:
    """Every message_id in the Parquet files under `output` (read without a SparkSession:
    hidden and `_` directories, such as the file sink's `_spark_metadata`, are skipped)."""
    import pyarrow.parquet as pq

    out: list[str] = []
    for f in sorted(output.rglob("*.parquet")):
        if any(part.startswith((".", "_")) for part in f.relative_to(output).parts):
            continue
        out += pq.read_table(f, columns=["message_id"]).column("message_id").to_pylist()
    return out


def _client(remote: str, url: str, queue: str, base: Path, sink: str, *more: str) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, str(CLIENT), remote, url, queue, str(base), sink, *more],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=400,
    )
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    assert lines, f"the client printed no result (exit {out.returncode}):\n{out.stderr[-3000:]}"
    result: dict[str, Any] = json.loads(lines[-1])
    result["stderr"] = out.stderr[-3000:]
    return result


@pytest.mark.parametrize("sink", ["foreachBatch", "parquet"])
def test_the_queue_source_runs_under_spark_connect(
    connect_server, amqp_url, rabbitmq, queue_factory, tmp_path, sink
):
    q = queue_factory(f"connect-{sink}")
    good, _ = publish_orders(amqp_url, q, N)
    result = _client(connect_server, amqp_url, q, tmp_path, sink)
    if not result["ok"] and SLOW_WORKER in str(result.get("error")):
        # The server waits a fixed 10 s for the foreachBatch Python worker to connect back,
        # and that worker imports the Connect client first: a loaded machine can miss it.
        # The query never started (nothing read); the same job again on its checkpoint.
        result = _client(connect_server, amqp_url, q, tmp_path, sink)
    assert result["ok"], f"{result.get('stage')}: {result.get('error')}\n{result['stderr']}"
    ids = _ids(tmp_path / "out")
    assert len(ids) == len(set(ids)) and sorted(ids) == sorted(good)
    if sink == "foreachBatch":
        # Each batch acked after its write: the queue is empty once the run ended.
        wait_for(
            lambda: (lambda c: (c.ready, c.unacked))(rabbitmq.counts(q)) == (0, 0), 60, "drained"
        )
    else:
        # Spark's file sink acks through commit(), which Spark calls only while planning
        # the next batch: the run's last batch is back in the queue, written. The next run
        # recognises those messages as written (the checkpoint's commit log) and acks them.
        wait_for(lambda: rabbitmq.counts(q).unacked == 0, 60, "the run's connection closed")
        left = rabbitmq.counts(q).ready
        assert 0 < left <= 100, left
        again = _client(connect_server, amqp_url, q, tmp_path, sink)
        assert again["ok"], again
        ids = _ids(tmp_path / "out")
        assert sorted(ids) == sorted(good)  # nothing written twice
        wait_for(lambda: rabbitmq.counts(q).ready == 0, 60, "the copies acked")


def test_the_stream_source_runs_under_spark_connect(connect_server, stream_broker, tmp_path):
    # Under Connect the stream source plans in the server's source runner and reads in
    # the server's Python workers, as without it; the client only sends the query.
    from tests._streams import declare_stream, delete_queues, publish

    node = stream_broker
    name = f"connect-{secrets.token_hex(3)}"
    declare_stream(node.url, name)
    try:
        ids = [f"s-{i:04d}" for i in range(N)]
        publish(node.url, node.stream_port, name, [(m, b"x") for m in ids])
        port = str(node.stream_port)
        result = _client(connect_server, node.url, name, tmp_path, "stream", port)
        if not result["ok"] and SLOW_WORKER in str(result.get("error")):
            result = _client(connect_server, node.url, name, tmp_path, "stream", port)
        assert result["ok"], f"{result.get('stage')}: {result.get('error')}\n{result['stderr']}"
        assert sorted(_ids(tmp_path / "out")) == ids
        # the next run on the same checkpoint reads only what came since
        more = [f"t-{i:04d}" for i in range(N // 2)]
        publish(node.url, node.stream_port, name, [(m, b"y") for m in more])
        again = _client(connect_server, node.url, name, tmp_path, "stream", port)
        assert again["ok"], again
        assert sorted(_ids(tmp_path / "out")) == sorted(ids + more)
    finally:
        delete_queues(node.url, name)
