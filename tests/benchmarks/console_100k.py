"""How the console does with 100,000 dead letters: index time, page load times, memory.

    PYTHONPATH=. python -m tests.benchmarks.console_100k [--count N] [--rabbitmq 3.10|4.3]

Starts a broker node of the test kit's own, fills `orders.dlq` with N dead letters
carrying ackkit's dead-letter headers (12 failure groups across 4 listeners, failure
times spread over 6 hours), runs the real `ackkit console` command in a subprocess,
and reports: time until all N are held and indexed, load times of the overview and
the group list (median of 5), the console's resident memory, the time to replay a
group of ~8,000, and the broker's counts after the console stopped.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from datetime import UTC, datetime, timedelta

import pika

from ackkit._core import headers as H
from ackkit.testing import provision_broker

LISTENERS = ("orders", "billing", "shipping", "emails")
ERRORS = (
    ("KeyError", "'sku-{i}'"),
    ("ValueError", "bad price {i}.99 for order {i}"),
    ("TimeoutError", "payment gateway timed out after {i} ms"),
)


def fill(url: str, queue: str, n: int) -> float:
    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    ch.queue_declare(queue, durable=True)
    ch.queue_declare("orders.parking", durable=True)
    t0 = time.monotonic()
    now = datetime.now(UTC)
    for i in range(n):
        listener = LISTENERS[i % len(LISTENERS)]
        etype, msg = ERRORS[(i // len(LISTENERS)) % len(ERRORS)]
        at = (now - timedelta(seconds=(i * 21600) // n)).isoformat(timespec="milliseconds")
        headers = {
            H.REASON: "attempts exhausted (3 of 3)",
            H.ERROR_TYPE: etype,
            H.ERROR_MESSAGE: msg.format(i=i),
            H.ERROR_TRACEBACK: f'Traceback (most recent call last):\n  File "s.py"\n{etype}',
            H.ATTEMPTS: 3,
            H.LISTENER: listener,
            H.ORIGINAL_QUEUE: "orders.parking",
            H.DEAD_LETTERED_AT: at,
        }
        body = json.dumps({"order": i, "sku": f"sku-{i}", "lines": [1, 2, 3], "note": "x" * 80})
        props = pika.BasicProperties(
            message_id=f"m{i}", headers=headers, content_type="application/json", delivery_mode=2
        )
        ch.basic_publish("", queue, body.encode(), props)
        if i % 5000 == 4999:
            conn.process_data_events(0)
    while ch.queue_declare(queue, passive=True).method.message_count < n:
        time.sleep(0.1)
    conn.close()
    return time.monotonic() - t0


def get(url: str) -> tuple[float, str]:
    t0 = time.monotonic()
    with urllib.request.urlopen(url, timeout=60) as r:
        text = r.read().decode()
    return time.monotonic() - t0, text


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--count", type=int, default=100_000)
    ap.add_argument("--rabbitmq", default=None)
    args = ap.parse_args()
    n, q = args.count, "orders.dlq"
    with provision_broker(exclusive=True, rabbitmq=args.rabbitmq) as broker:
        url = broker.url
        print(f"broker {broker!r}")
        print(f"published {n} dead letters in {fill(url, q, n):.1f} s")
        port = free_port()
        cmd = [sys.executable, "-m", "ackkit.cli", "console", "--url", url, "--dlq", q]
        cmd += ["--port", str(port)]
        proc = subprocess.Popen(cmd, env={**os.environ, "PYTHONPATH": os.getcwd()})
        base = f"http://127.0.0.1:{port}"
        try:
            t0 = time.monotonic()
            while True:
                try:
                    _, page = get(base + "/")
                    held = re.search(r'class="count">(\d+)<', page)
                    if held and int(held.group(1)) == n:
                        break
                except OSError:
                    pass
                if proc.poll() is not None:
                    raise SystemExit("the console exited")
                time.sleep(0.2)
            print(
                f"console up and all {n} held and indexed after {time.monotonic() - t0:.1f} s "
                f"({cpu_seconds(proc.pid):.1f} s of CPU; load average {os.getloadavg()[0]:.1f} "
                f"on {os.cpu_count()} cores)"
            )
            for path in ("/", "/groups"):
                times = [get(base + path)[0] for _ in range(5)]
                print(f"GET {path}: median {statistics.median(times) * 1000:.0f} ms (of 5)")
            _, groups = get(base + "/groups")
            gids = re.findall(r'href="/group/([0-9a-f]+)"', groups)
            print(f"{len(gids)} groups")
            for path in (f"/group/{gids[0]}", "/letter/1"):
                times = [get(base + path)[0] for _ in range(5)]
                print(f"GET {path}: median {statistics.median(times) * 1000:.0f} ms (of 5)")
            print(f"console RSS: {rss_mb(proc.pid):.0f} MB")
            csrf = re.search(r'name="csrf" value="([0-9a-f]+)"', get(f"{base}/group/{gids[0]}")[1])
            assert csrf
            count = int(
                re.search(r'class="group-count">(\d+)<', get(f"{base}/group/{gids[0]}")[1]).group(1)
            )  # type: ignore[union-attr]
            form = f"csrf={csrf.group(1)}&action=replay&scope=group&group={gids[0]}&to=".encode()
            t0 = time.monotonic()
            req = urllib.request.Request(base + "/act", data=form, method="POST")
            with urllib.request.urlopen(req, timeout=600) as r:
                result = re.search(r'id="result">([^<]*)<', r.read().decode())
            dt = time.monotonic() - t0
            print(
                f"replay of a group of {count}: {dt:.1f} s ({count / dt:.0f}/s): "
                + (result.group(1) if result else "?")
            )
            print(f"console RSS after: {rss_mb(proc.pid):.0f} MB")
            _, page = get(base + "/")
            for err in re.findall(r'<div class="error">([^<]*)<', page):
                print(f"console error: {err}")
            held = re.search(r'class="count">(\d+)<', page)
            print(f"held after the replay: {held.group(1) if held else '?'}")
        finally:
            proc.send_signal(signal.SIGINT)
            proc.wait(900)  # it waits for the broker to take back what it held
        t0 = time.monotonic()
        c = broker.wait_for(q, unacked=0, consumers=0, timeout=600, interval=1.0)
        p = broker.counts("orders.parking")
        print(
            f"{time.monotonic() - t0:.0f} s after the console stopped: {q} ready {c.ready} "
            f"unacked {c.unacked}; parking {p.ready}"
        )


if __name__ == "__main__":
    main()
