"""The stream source under random SIGKILLs: exactly-once output all the same.

A driver process (`_spark_streams_driver.py`) reads a super stream of 3 partitions into
idempotent Parquet batches. Each round publishes more records, starts the driver, waits
until it has written a batch or two, and SIGKILLs, at a random moment (seeded, printed):
the whole driver (its process group: JVM, source runner, Python workers), or only the
Python workers that run the executors' reads (the tasks are retried). Before the last
round the deployment changes: a fourth partition is added to the super stream (as an
operator scales it), and that round's driver is killed too. A last run, in this
process, reads to the end (AvailableNow). The output must then hold every published
record exactly once, compared with what plain rstream reads from the stream.

Super streams need 3.11+: this runs on the 4.3 leg of make test (the plain stream path
shares all of its code but the partition listing).
"""

from __future__ import annotations

import contextlib
import os
import random
import secrets
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from _spark_support import output_ids, wait_for

pytest.importorskip("pyspark")
pytest.importorskip("rstream")

import ackkit.spark as aks
from tests._streams import declare_super_stream, delete_queues, message_ids, publish, version_of

pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.timeout(900)]

DRIVER = Path(__file__).with_name("_spark_streams_driver.py")
# (what is killed, whether a partition is added before the round). make test's short
# form: the workers, then the driver after a partition is added (a Spark start-up a
# round, ~40 s on 2 cores); make soak (ACKKIT_FUZZ) adds a plain driver kill first.
ROUNDS = (("workers", False), ("driver", True))
if os.environ.get("ACKKIT_FUZZ"):
    ROUNDS = (("driver", False), *ROUNDS)
PER_ROUND = 700
SEED = int(os.environ.get("ACKKIT_STREAMS_KILL_SEED") or 20261126)


def _batches(out: Path) -> int:
    return sum(1 for p in out.iterdir() if p.name.startswith("batch=")) if out.exists() else 0


def _python_workers(driver_pid: int) -> list[int]:
    """The Python workers that run the executors' tasks: descendants of the driver
    (pyspark's worker daemons start sessions of their own, so not its process group)
    running ``pyspark.daemon pyspark.worker``, the daemon and the workers it forked."""
    parent: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                stat = Path(f"/proc/{entry}/stat").read_text()
                parent[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])

    def under_driver(pid: int) -> bool:
        while pid > 1:
            pid = parent.get(pid, 0)
            if pid == driver_pid:
                return True
        return False

    pids = []
    for pid in parent:
        with contextlib.suppress(OSError):
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            if b"pyspark.daemon" in cmd and b"pyspark.worker" in cmd and under_driver(pid):
                pids.append(pid)
    return pids


def test_random_kills_keep_the_output_exactly_once(
    spark: Any, stream_broker: Any, tmp_path: Path
) -> None:
    node = stream_broker
    if version_of(node.url) < (3, 11):
        pytest.skip("super streams need RabbitMQ 3.11+ (this runs on the 4.3 leg)")
    rnd = random.Random(SEED)
    print(f"ACKKIT_STREAMS_KILL_SEED={SEED}")
    name = f"kill-{secrets.token_hex(3)}"
    parts = declare_super_stream(node.url, name, 3)
    out = tmp_path / "out"
    published = 0
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable)
    try:
        for rnd_no, (what, grow) in enumerate(ROUNDS):
            if grow:  # the deployment changes under the checkpoint, then a kill
                parts += declare_super_stream(node.url, name, 1, first=len(parts))
                print(f"round {rnd_no}: partition {parts[-1]} added")
            for i, part in enumerate(parts):
                ids = range(published + i, published + PER_ROUND, len(parts))
                publish(node.url, node.stream_port, part, [(f"r-{k:06d}", b"x") for k in ids])
            published += PER_ROUND
            seen = _batches(out)
            log = open(tmp_path / f"driver-{rnd_no}.log", "wb")  # noqa: SIM115
            proc = subprocess.Popen(
                [
                    sys.executable,
                    str(DRIVER),
                    node.url,
                    str(node.stream_port),
                    "super_stream",
                    name,
                    str(tmp_path),
                ],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            try:
                # a round's records (and any left from before) fill >= 3 batches of 300
                want = seen + (1 if what == "workers" else rnd.randint(1, 2))
                wait_for(
                    lambda w=want, p=proc: _batches(out) >= w or p.poll() is not None,
                    300,
                    f"round {rnd_no}: batch {want} written",
                )
                log_text = (tmp_path / f"driver-{rnd_no}.log").read_text(errors="replace")
                assert proc.poll() is None, log_text[-3000:]
                time.sleep(rnd.uniform(0, 1.5))
                if what == "workers":
                    victims = _python_workers(proc.pid)
                    assert victims, "no Python worker of the driver found to kill"
                    for pid in victims:
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(pid, signal.SIGKILL)
                    print(f"round {rnd_no}: killed {len(victims)} Python worker(s)")
                    # the retried tasks go on: the round's last batches get written
                    wait_for(lambda s=seen: _batches(out) >= s + 3, 300, "batches after the kill")
            finally:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(30)
                log.close()
            print(f"round {rnd_no} ({what}): {_batches(out)} batches written")

        # the last run, in this process: to the end of what is there
        df = aks.read_stream_source(
            spark,
            url=node.url,
            checkpoint=tmp_path / "ck",
            stream_port=node.stream_port,
            super_stream=name,
            max_messages_per_trigger=300,
        )
        q = aks.start(
            df.select("stream", "offset", "message_id")
            .writeStream.foreachBatch(aks.parquet_batches(out))
            .option("checkpointLocation", str(tmp_path / "ck"))
            .trigger(availableNow=True)
        )
        assert q.awaitTermination(300)
        assert q.exception() is None
        got = output_ids(spark, out)
        dups = [m for m, c in Counter(got).items() if c > 1]
        assert not dups, f"{len(dups)} duplicated, e.g. {dups[:3]}"
        in_stream = [m for p in parts for m in message_ids(node.url, node.stream_port, p)]
        assert len(in_stream) == published
        assert sorted(got) == sorted(in_stream)
    finally:
        delete_queues(node.url, *parts)
