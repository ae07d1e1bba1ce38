"""One chaos consumer process: an App (pika) or AsyncApp (aio-pika) on the chaos queues.

Every handler run is recorded in this process's record file, one line each, before
the handler does anything and when it ends (line-buffered: a SIGKILL loses nothing
written; fsynced every half second):

    S <unix time> <message_id> <attempt> <redelivered 0|1> <pid>
    E <unix time> <message_id> <attempt> ok|fail <pid>

Good messages return; poison ones always raise; slow ones block past the broker's
consumer_timeout, then raise. Run until SIGTERM (graceful shutdown).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import threading
import time
from typing import Any, TextIO

from pydantic import BaseModel

from ackkit import AckMode, App, AsyncApp, Consumer, Delivery, Queue, Retry, RetryStrategy

from .messages import MAX_BODY

RETRY = Retry(
    max_attempts=3,
    initial_interval=0.2,
    multiplier=2.0,
    max_interval=0.4,
    strategy=RetryStrategy.BROKER,
)


class Order(BaseModel):
    id: int
    kind: str
    pad: str = ""


class ChaosPoison(Exception):
    """What a poison message's handler raises, every time."""


class SlowTimeout(Exception):
    """A slow message's handler gives up after blocking past the consumer timeout."""


class Recorder:
    """Append-only record of handler runs; line-buffered, fsynced periodically."""

    def __init__(self, path: str) -> None:
        self.fh: TextIO = open(path, "a", buffering=1, encoding="ascii")  # noqa: SIM115
        self.pid = os.getpid()
        self.lock = threading.Lock()
        threading.Thread(target=self._sync, name="chaos-fsync", daemon=True).start()

    def _sync(self) -> None:
        while True:
            time.sleep(0.5)
            with self.lock:
                self.fh.flush()
                os.fsync(self.fh.fileno())

    def start(self, d: Delivery) -> None:
        line = f"S {time.time():.3f} {d.message_id} {d.attempt} {int(d.redelivered)} {self.pid}\n"
        with self.lock:
            self.fh.write(line)

    def end(self, d: Delivery, outcome: str) -> None:
        line = f"E {time.time():.3f} {d.message_id} {d.attempt} {outcome} {self.pid}\n"
        with self.lock:
            self.fh.write(line)


def listener_kw(queue: str, quorum: bool) -> dict[str, Any]:
    return {
        "ack_mode": AckMode.AUTO,
        "retry": RETRY,
        "dead_letter": "{queue}.dlq",
        "name": queue,
    }


def queue_of(queue: str, quorum: bool) -> Queue:
    return Queue(queue, arguments={"x-queue-type": "quorum"} if quorum else {})


def build_sync(args: argparse.Namespace, rec: Recorder, protocol: str = "amqp0-9-1") -> App:
    app = App(
        args.url,
        protocol=protocol,
        heartbeat=10,
        reconnect_max_interval=2.0,
        shutdown_timeout=5.0,
        startup_timeout=180.0,
        connection_name=f"chaos-{'sync' if protocol == 'amqp0-9-1' else 'amqp10'}-{os.getpid()}",
    )

    def handle(order: Order, d: Delivery) -> None:
        rec.start(d)
        if order.kind == "poison":
            rec.end(d, "fail")
            raise ChaosPoison(f"poison {d.message_id}")
        if order.kind == "slow":
            time.sleep(args.slow_seconds)
            rec.end(d, "fail")
            raise SlowTimeout(f"slow {d.message_id} blocked {args.slow_seconds} s")
        rec.end(d, "ok")

    for q, quorum in queues(args):
        consumer = Consumer(prefetch=args.prefetch, concurrency=4, max_body_size=MAX_BODY)
        app.listener(queue_of(q, quorum), consumer=consumer, **listener_kw(q, quorum))(handle)
    return app


def build_async(args: argparse.Namespace, rec: Recorder) -> AsyncApp:
    app = AsyncApp(
        args.url,
        heartbeat=10,
        reconnect_max_interval=2.0,
        shutdown_timeout=5.0,
        startup_timeout=180.0,
        connection_name=f"chaos-async-{os.getpid()}",
    )

    async def handle(order: Order, d: Delivery) -> None:
        rec.start(d)
        if order.kind == "poison":
            rec.end(d, "fail")
            raise ChaosPoison(f"poison {d.message_id}")
        if order.kind == "slow":
            await asyncio.sleep(args.slow_seconds)
            rec.end(d, "fail")
            raise SlowTimeout(f"slow {d.message_id} blocked {args.slow_seconds} s")
        await asyncio.sleep(0)
        rec.end(d, "ok")

    for q, quorum in queues(args):
        consumer = Consumer(prefetch=args.prefetch, concurrency=16, max_body_size=MAX_BODY)
        app.listener(queue_of(q, quorum), consumer=consumer, **listener_kw(q, quorum))(handle)
    return app


def queues(args: argparse.Namespace) -> list[tuple[str, bool]]:
    return [(args.classic, False), (args.quorum, True)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.chaos.consumer")
    ap.add_argument("--runtime", choices=("sync", "async", "amqp10"), required=True)
    ap.add_argument("--url", required=True)
    ap.add_argument("--classic", required=True)
    ap.add_argument("--quorum", required=True)
    ap.add_argument("--record", required=True)
    ap.add_argument("--prefetch", type=int, default=50)
    ap.add_argument("--slow-seconds", type=float, default=10.0)
    args = ap.parse_args(argv)
    logging.basicConfig(
        stream=sys.stderr,
        level=logging.INFO,
        format="%(created).3f %(process)d %(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger("pika").setLevel(logging.WARNING)
    logging.getLogger("aiormq").setLevel(logging.WARNING)
    logging.getLogger("aio_pika").setLevel(logging.WARNING)
    rec = Recorder(args.record)
    if args.runtime == "sync":
        build_sync(args, rec).run()
    elif args.runtime == "amqp10":
        build_sync(args, rec, protocol="amqp1.0").run()
    else:
        asyncio.run(build_async(args, rec).run())
    return 0


if __name__ == "__main__":
    sys.exit(main())
