"""Spark tests: one local SparkSession for the whole run, started on first use."""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

# The repo root, so that `spark` is the pipeline package at the top of the repo (this
# directory has no __init__.py on purpose: as a package it would be called `spark` too).
ROOT = str(Path(__file__).resolve().parents[2])
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


# Every JVM these tests start (the session's, the drivers they kill, a standalone
# cluster's daemons and executors, Spark Connect's server) lives for seconds to minutes on
# a few hundred rows: C1 alone and the serial collector cost a third less CPU than the
# JVM's defaults (test_spark_deploy.py: 232 s of machine CPU to 156 s, wall 179 s to
# 139 s; test_spark_crash.py: 182 s to 131 s). Not for benchmarks (their steady state is
# C2's). A JAVA_TOOL_OPTIONS of the user's own is kept.
os.environ.setdefault("JAVA_TOOL_OPTIONS", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")


def _java() -> bool:
    return shutil.which("java") is not None


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    if not _java():
        pytest.skip("Spark tests need Java (a JRE 17 on PATH)")
    pytest.importorskip("pyspark")
    from spark.orders_pipeline import spark_session

    session = spark_session("ackkit-tests")
    yield session
    session.stop()


@pytest.fixture(scope="module")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A Spark standalone cluster on loopback for one test module: a master and two
    workers of 1 core each, every one its own JVM (`_spark_cluster.SparkCluster`; a driver
    uses it through `cluster.session_conf()`). Stopped afterwards, executors included."""
    if not _java():
        pytest.skip("Spark tests need Java (a JRE 17 on PATH)")
    pytest.importorskip("pyspark")
    from _spark_cluster import SparkCluster

    with SparkCluster(tmp_path_factory.mktemp("spark-cluster"), workers=2) as cluster:
        yield cluster
    assert not cluster.left, f"Spark cluster processes left running: {sorted(cluster.left)}"


# Credentials for the S3-compatible test server (any value does): set before Spark starts,
# so that the source runner and the Python workers the JVM spawns inherit them.
os.environ.setdefault("AWS_ACCESS_KEY_ID", "ackkit-test")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "ackkit-test")
os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def s3_base() -> Iterator[str]:
    """An S3-compatible server (moto, server mode) on 127.0.0.1 with a fresh bucket; yields
    an s3:// URI prefix whose query points pyarrow at it."""
    moto = Path(sys.executable).with_name("moto_server")
    if not moto.exists():
        pytest.skip("moto[server] is not installed (pip install 'ackkit[dev]')")
    port = _free_port()
    proc = subprocess.Popen(
        [str(moto), "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=1).close()
                break
            except urllib.error.HTTPError:
                break  # it answers
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail("the moto S3 server did not start")
                time.sleep(0.2)
        bucket = f"ackkit-{secrets.token_hex(4)}"
        query = f"endpoint_override=127.0.0.1:{port}&scheme=http&region=us-east-1"
        import pyarrow.fs as pafs

        fs, _ = pafs.FileSystem.from_uri(f"s3://{bucket}?{query}&allow_bucket_creation=true")
        fs.create_dir(bucket)
        yield f"s3://{bucket}/run?{query}"
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
