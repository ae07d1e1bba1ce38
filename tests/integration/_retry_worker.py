"""A consumer process for the retry / dead-letter tests (killed and restarted by them).

    python -m tests.integration._retry_worker --url URL --queue Q --log FILE [options]

Every handler invocation is appended to FILE as one JSON line (pid, attempt,
message id, wall time), flushed and fsynced before the handler goes on, so a
SIGKILL right after cannot lose the record. The handler fails on attempts below
--succeed-at (0: always fails) after holding the delivery for --hold seconds.
A line {"ready": pid} is written once the App consumes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import threading
import time
from typing import Any

from ackkit import App, AsyncApp, AsyncDelivery, Consumer, Delivery, Queue, Retry, RetryStrategy


class Boom(Exception):
    """The failure the test handler raises."""


def record(path: str, entry: dict[str, Any]) -> None:
    line = json.dumps(entry) + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def build(args: argparse.Namespace) -> App | AsyncApp:
    make = AsyncApp if args.runtime == "async" else App
    app = make(args.url, shutdown_timeout=5.0, connection_name="ackkit-retry-worker")
    queue_args: dict[str, Any] = {}
    if args.queue_type != "classic":
        queue_args["x-queue-type"] = args.queue_type
    if args.delivery_limit is not None:
        queue_args["x-delivery-limit"] = args.delivery_limit
    if args.dlx_to:
        queue_args["x-dead-letter-exchange"] = ""
        queue_args["x-dead-letter-routing-key"] = args.dlx_to
    retry = Retry(
        max_attempts=args.max_attempts,
        initial_interval=args.initial,
        multiplier=args.multiplier,
        max_interval=30.0,
        strategy=RetryStrategy(args.strategy),
    )

    def invoked(d: Delivery | AsyncDelivery) -> None:
        record(
            args.log,
            {
                "pid": os.getpid(),
                "attempt": d.attempt,
                "mid": d.message_id,
                "t": time.time(),
                "redelivered": d.redelivered,
            },
        )
        if args.die_on and d.message_id == args.die_on:
            os.kill(os.getpid(), signal.SIGKILL)  # the message kills its consumer process

    def outcome(d: Delivery | AsyncDelivery) -> None:
        if args.succeed_at and d.attempt >= args.succeed_at:
            return
        raise Boom(f"attempt {d.attempt} failed")

    listener = app.listener(
        Queue(args.queue, arguments=queue_args),
        retry=retry,
        consumer=Consumer(prefetch=args.prefetch),
    )
    if isinstance(app, AsyncApp):

        async def ahandle(d: AsyncDelivery) -> None:
            invoked(d)
            if args.hold:
                await asyncio.sleep(args.hold)
            outcome(d)

        listener(ahandle)
    else:

        def handle(d: Delivery) -> None:
            invoked(d)
            if args.hold:
                time.sleep(args.hold)
            outcome(d)

        listener(handle)
    return app


def slow_writes(seconds: float) -> None:
    """pika writes what its channels send when the I/O loop finds the socket writable:
    wait `seconds` first, as a descheduled I/O thread on a loaded machine would. Frames
    such as basic.ack leave late; the handler threads run meanwhile."""
    from pika.adapters.utils.io_services_utils import _AsyncPlaintextTransport as T

    writable = T._on_socket_writable

    def late(self: Any) -> None:
        time.sleep(seconds)
        writable(self)

    T._on_socket_writable = late  # type: ignore[method-assign]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--url", required=True)
    p.add_argument("--queue", required=True)
    p.add_argument("--log", required=True)
    p.add_argument("--max-attempts", type=int, default=5)
    p.add_argument("--initial", type=float, default=0.2)
    p.add_argument("--multiplier", type=float, default=1.0)
    p.add_argument("--strategy", default="broker")
    p.add_argument("--succeed-at", type=int, default=0)
    p.add_argument("--hold", type=float, default=0.0)
    p.add_argument("--die-on", default=None, help="SIGKILL itself handling this message id")
    p.add_argument("--prefetch", type=int, default=10)
    p.add_argument("--queue-type", default="classic")
    p.add_argument("--runtime", choices=("sync", "async"), default="sync")
    p.add_argument("--delivery-limit", type=int, default=None)
    p.add_argument("--dlx-to", default=None, help="the queue's own DLX route (broker-side)")
    p.add_argument(
        "--slow-writes",
        type=float,
        default=0.0,
        help="the I/O thread waits this long before each socket write",
    )
    args = p.parse_args()
    if args.slow_writes:
        slow_writes(args.slow_writes)
    app = build(args)
    if isinstance(app, AsyncApp):
        asyncio.run(run_async(app, args.log))
        return
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    app.start()
    record(args.log, {"ready": os.getpid()})
    try:
        while not stop.wait(0.2):
            pass
    finally:
        app.stop()


async def run_async(app: AsyncApp, log: str) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await app.start()
    record(log, {"ready": os.getpid()})
    try:
        await stop.wait()
    finally:
        await app.stop()


if __name__ == "__main__":
    main()
