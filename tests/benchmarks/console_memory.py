"""The console's memory per dead letter it holds, measured on the real command.

    PYTHONPATH=. python -m tests.benchmarks.console_memory [--steps 20000,100000]
        [--rabbitmq 3.10|4.3]

Starts a broker node of the test kit's own and the real `ackkit console` command in a
subprocess on an empty DLQ; reads its resident memory (VmRSS) once it serves (the
baseline, pages rendered once), then publishes dead letters in steps (the same ones as
console_100k: ackkit's headers with a short traceback, a JSON body of about 140 bytes,
12 failure groups; --note and --traceback make them larger) and reads VmRSS again each
time the console holds all of them.
Reports MB and KB per held dead letter above the baseline, and the size of one dead
letter on the wire (body and encoded headers).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta

import pika

from ackkit._core import headers as H
from ackkit.testing import provision_broker

from .console_100k import ERRORS, LISTENERS, free_port, get, rss_mb

SHAPE = {"note": 80, "traceback": 0}
"""Padding of each dead letter: characters of the body's note, and of traceback lines
added to the short one (set by --note and --traceback)."""


def letter(i: int, n: int, now: datetime) -> tuple[bytes, pika.BasicProperties]:
    """The i-th of console_100k's dead letters (failure times spread over 6 hours)."""
    frames = (
        "".join(
            f'  File "/srv/app/handlers/orders_{k}.py", line {k}, in handle\n    step({k})\n'
            for k in range(SHAPE["traceback"] // 70)
        )
        or '  File "s.py"\n'
    )
    listener = LISTENERS[i % len(LISTENERS)]
    etype, msg = ERRORS[(i // len(LISTENERS)) % len(ERRORS)]
    at = (now - timedelta(seconds=(i * 21600) // n)).isoformat(timespec="milliseconds")
    headers = {
        H.REASON: "attempts exhausted (3 of 3)",
        H.ERROR_TYPE: etype,
        H.ERROR_MESSAGE: msg.format(i=i),
        H.ERROR_TRACEBACK: f"Traceback (most recent call last):\n{frames}{etype}",
        H.ATTEMPTS: 3,
        H.LISTENER: listener,
        H.ORIGINAL_QUEUE: "orders.parking",
        H.DEAD_LETTERED_AT: at,
    }
    body = json.dumps(
        {"order": i, "sku": f"sku-{i}", "lines": [1, 2, 3], "note": "x" * SHAPE["note"]}
    )
    props = pika.BasicProperties(
        message_id=f"m{i}", headers=headers, content_type="application/json", delivery_mode=2
    )
    return body.encode(), props


def publish(url: str, queue: str, start: int, stop: int, n: int) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    now = datetime.now(UTC)
    for i in range(start, stop):
        body, props = letter(i, n, now)
        ch.basic_publish("", queue, body, props)
        if i % 5000 == 4999:
            conn.process_data_events(0)
    conn.close()


def held(base: str) -> int:
    m = re.search(r'class="num held">(\d+)<', get(base + "/")[1])
    return int(m.group(1)) if m else -1


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", default="20000,100000")
    ap.add_argument("--rabbitmq", default=None)
    ap.add_argument("--note", type=int, default=80, help="characters of the body's note")
    ap.add_argument("--traceback", type=int, default=0, help="about so many more bytes")
    args = ap.parse_args()
    SHAPE.update(note=args.note, traceback=args.traceback)
    steps = [int(s) for s in args.steps.split(",")]
    q, n = "orders.dlq", steps[-1]
    body, props = letter(0, n, datetime.now(UTC))
    wire = len(body) + sum(len(part) for part in props.encode())
    print(f"one dead letter: {len(body)} B body, {wire} B body and properties on the wire")
    print(f"its traceback: {len(props.headers[H.ERROR_TRACEBACK])} characters")
    with provision_broker(exclusive=True, rabbitmq=args.rabbitmq) as broker:
        url = broker.url
        conn = pika.BlockingConnection(pika.URLParameters(url))
        conn.channel().queue_declare(q, durable=True)
        conn.close()
        port = free_port()
        cmd = [sys.executable, "-m", "ackkit.cli", "console", "--url", url, "--dlq", q]
        cmd += ["--port", str(port), "--max-held", str(n)]
        proc = subprocess.Popen(cmd, env={**os.environ, "PYTHONPATH": os.getcwd()})
        base = f"http://127.0.0.1:{port}"
        try:
            while True:
                try:
                    if held(base) == 0:
                        break
                except OSError:
                    pass
                if proc.poll() is not None:
                    raise SystemExit("the console exited")
                time.sleep(0.2)
            for path in ("/groups", "/audit"):
                get(base + path)
            before = rss_mb(proc.pid)
            print(f"console RSS serving, holding nothing: {before:.1f} MB")
            done = 0
            for step in steps:
                publish(url, q, done, step, n)
                done = step
                t0 = time.monotonic()
                while held(base) < step:
                    if proc.poll() is not None:
                        raise SystemExit("the console exited")
                    if time.monotonic() - t0 > 1800:
                        raise SystemExit(f"not all {step} held after 30 minutes")
                    time.sleep(0.5)
                get(base + "/groups")
                after = rss_mb(proc.pid)
                per = (after - before) * 1024 / step
                print(
                    f"holding {step}: RSS {after:.1f} MB, {after - before:.1f} MB above the "
                    f"baseline, {per:.2f} KB per dead letter"
                )
        finally:
            proc.send_signal(signal.SIGINT)
            proc.wait(900)


if __name__ == "__main__":
    main()
