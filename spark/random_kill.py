"""Random SIGKILLs of a whole Spark driver (its process group), restarted on the same
checkpoint until the queues are drained; then the output is compared with the input.

    python -m spark.random_kill --messages 20000 --shards 2 --kills 5 --seed 1 [--s3]

The driver is `tests/spark/_spark_crash_driver.py` without a crash point (it runs the
orders pipeline until drained). Each round starts it in a new session, waits until it
has written a batch, and kills the group a random time (seeded) after that. `--s3`
keeps the write-ahead log on a moto S3 server started here on 127.0.0.1. Prints one
JSON line: rows, distinct ids, missing, unexpected, dead letters, the queues' ready
count. Exit 0 when the output holds every valid order exactly once and the queues
are drained.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pika
import pyarrow.parquet as pq

from ackkit.shards import ShardKind, declare_shards
from spark.orders_pipeline import DEFAULT_URL, publish_orders

ROOT = Path(__file__).resolve().parents[1]
DRIVER = ROOT / "tests" / "spark" / "_spark_crash_driver.py"


def _moto() -> tuple[subprocess.Popen[bytes], str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [str(Path(sys.executable).with_name("moto_server")), "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=1).close()
            break
        except urllib.error.HTTPError:
            break
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError("moto did not start") from None
            time.sleep(0.2)
    import pyarrow.fs as pafs

    query = f"endpoint_override=127.0.0.1:{port}&scheme=http&region=us-east-1"
    fs, _ = pafs.FileSystem.from_uri(f"s3://killrun?{query}&allow_bucket_creation=true")
    fs.create_dir("killrun")
    return proc, f"s3://killrun/wal?{query}"


def batches_written(out: Path) -> int:
    """How many batches are in the Parquet output (`batch=<id>` directories)."""
    return len(list(out.glob("batch=*"))) if out.is_dir() else 0


OnWrite = Callable[[int, "subprocess.Popen[bytes]", "float | None"], None]


def kill_rounds(
    cmd: list[str],
    env: dict[str, str],
    base: Path,
    rng: random.Random,
    *,
    kills: int,
    min_s: float = 0.0,
    max_s: float = 10.0,
    timeout: float = 900.0,
    on_write: OnWrite | None = None,
) -> tuple[int, int | None]:
    """Run the driver `cmd` (which writes Parquet batches under `base/out`) `kills + 1`
    times, each in a new session with its log in `base/driver-<round>.log`. Every round
    but the last is SIGKILLed (its process group: the JVM and the source runners with it)
    a random time in [min_s, max_s] after it wrote a batch; the last runs until it exits
    (3: drained). Stops early when a round drains before its kill.

    `on_write(round, proc, kill_in)` runs once a round has written a batch (`kill_in`:
    seconds until its SIGKILL, None in the last round), e.g. to kill an executor
    meanwhile; its time counts towards the kill. Returns (driver kills, the last round's
    exit code)."""
    out = base / "out"
    killed = 0
    proc: subprocess.Popen[bytes] | None = None
    for round_no in range(kills + 1):
        log = open(base / f"driver-{round_no}.log", "wb")  # noqa: SIM115 - closed below
        proc = subprocess.Popen(
            cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        last = round_no == kills
        try:
            if last and on_write is None:
                proc.wait(timeout=timeout)
            else:
                # Mid-stream: once this run wrote a batch, at a random moment after it.
                seen = batches_written(out)
                deadline = time.monotonic() + timeout
                while batches_written(out) <= seen and proc.poll() is None:
                    if time.monotonic() > deadline:
                        raise subprocess.TimeoutExpired(cmd, timeout)
                    time.sleep(0.2)
                delay = None if last else rng.uniform(min_s, max_s)
                t0 = time.monotonic()
                if on_write is not None and proc.poll() is None:
                    on_write(round_no, proc, delay)
                if delay is None:
                    proc.wait(timeout=max(deadline - time.monotonic(), 1.0))
                else:
                    proc.wait(timeout=max(delay - (time.monotonic() - t0), 0.0))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            killed += 0 if last else 1
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # the JVM and runners with it
            proc.wait()
            log.close()
        if proc.returncode == 3 and not last:
            break  # drained before the kill
    return killed, None if proc is None else proc.returncode


def _ready(url: str, queues: list[str]) -> int:
    conn = pika.BlockingConnection(pika.URLParameters(url))
    try:
        ch = conn.channel()
        return sum(ch.queue_declare(q, passive=True).method.message_count for q in queues)
    finally:
        conn.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default=os.environ.get("AMQP_URL", DEFAULT_URL))
    p.add_argument("--messages", type=int, default=20_000)
    p.add_argument("--shards", type=int, default=2)
    p.add_argument("--max-batch", type=int, default=2000)
    p.add_argument("--kills", type=int, default=5)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--min-s", type=float, default=0.0, help="kill this long after a write")
    p.add_argument("--max-s", type=float, default=10.0)
    p.add_argument("--s3", action="store_true")
    args = p.parse_args(argv)
    rng = random.Random(args.seed)
    name = f"ackkit.killrun.{secrets.token_hex(3)}"
    base = Path(tempfile.mkdtemp(prefix="ackkit-killrun-"))
    layout = None
    if args.shards:
        layout = declare_shards(args.url, name, args.shards, kind=ShardKind.CLIENT)
        queues = list(layout.queues)
    else:
        queues = [name]
    good, bad = publish_orders(args.url, name, args.messages, poison_every=100, layout=layout)
    moto, wal = _moto() if args.s3 else (None, "")
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable)
    if args.s3:  # any credentials do for the local server (without, it refuses some calls)
        env.setdefault("AWS_ACCESS_KEY_ID", "ackkit-killrun")
        env.setdefault("AWS_SECRET_ACCESS_KEY", "ackkit-killrun")
        env.setdefault("AWS_EC2_METADATA_DISABLED", "true")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    cmd = [sys.executable, str(DRIVER), args.url, name, str(base), str(args.max_batch)]
    cmd += [str(args.shards), wal]
    t0 = time.monotonic()
    try:
        killed, last_exit = kill_rounds(
            cmd, env, base, rng, kills=args.kills, min_s=args.min_s, max_s=args.max_s
        )
    finally:
        if moto is not None:
            moto.terminate()
    out = base / "out"
    ids = pq.read_table(out, columns=["message_id"]).column(0).to_pylist() if out.exists() else []
    ready = _ready(args.url, queues)  # the driver is gone: anything unacked is ready again
    dead = _ready(args.url, [f"{q}.dlq" for q in queues])
    result = {
        "messages": args.messages,
        "valid": len(good),
        "malformed": len(bad),
        "shards": args.shards,
        "s3": args.s3,
        "seed": args.seed,
        "kills": killed,
        "rows": len(ids),
        "distinct": len(set(ids)),
        "missing": len(set(good) - set(ids)),
        "unexpected": len(set(ids) - set(good)),
        "ready": ready,
        "dead_letters": dead,
        "seconds": round(time.monotonic() - t0),
        "last_exit": last_exit,
    }
    print(json.dumps(result))
    conn = pika.BlockingConnection(pika.URLParameters(args.url))
    try:
        ch = conn.channel()
        for q in queues:
            ch.queue_delete(q)
            ch.queue_delete(f"{q}.dlq")
    finally:
        conn.close()
    ok = result["rows"] == result["distinct"] == len(good) and not result["missing"]
    return 0 if ok and ready == 0 and dead >= len(bad) else 1


if __name__ == "__main__":
    sys.exit(main())
