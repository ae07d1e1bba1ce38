"""A consumer process for the inbox crash test (SIGKILLed at random by the test).

argv: amqp_url dsn queue_a queue_b log_path [sync|async]. Listener A records each
message in effects_a and publishes one follow-up to B through the outbox; listener B
records the follow-up in effects_b. Duplicates the inbox absorbs are logged (one line
each). A worker started while the broker is down (the test restarts it) tries again
until it connects, as a supervisor would restart it."""

from __future__ import annotations

import asyncio
import faulthandler
import logging
import signal
import sys
import threading
import time

from ackkit import App, AsyncApp, Consumer, Delivery
from ackkit.inbox import Inbox

CONSUMER = Consumer(concurrency=4, prefetch=20)


def run_sync(url: str, inbox: Inbox, qa: str, qb: str) -> None:
    app = App(url, connection_name="inbox-crash", reconnect_max_interval=1.0)

    @app.listener(qa, inbox=inbox, consumer=CONSUMER, name="a")
    def on_a(body: bytes, d: Delivery) -> None:
        d.db.execute("INSERT INTO effects_a (msg) VALUES (%s)", (d.message_id,))
        d.publish(qb, body, message_id=f"{d.message_id}-f")

    @app.listener(qb, inbox=inbox, consumer=CONSUMER, name="b")
    def on_b(body: bytes, d: Delivery) -> None:
        d.db.execute("INSERT INTO effects_b (msg) VALUES (%s)", (d.message_id,))

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    while True:
        try:
            app.start()
            break
        except Exception:
            time.sleep(0.5)
    print("ready", flush=True)
    stop.wait()
    app.stop()


async def run_async(url: str, inbox: Inbox, qa: str, qb: str) -> None:
    app = AsyncApp(url, connection_name="inbox-crash-async", reconnect_max_interval=1.0)

    @app.listener(qa, inbox=inbox, consumer=CONSUMER, name="a")
    async def on_a(body: bytes, d: Delivery) -> None:
        await d.db.execute("INSERT INTO effects_a (msg) VALUES (%s)", (d.message_id,))
        await d.publish(qb, body, message_id=f"{d.message_id}-f")

    @app.listener(qb, inbox=inbox, consumer=CONSUMER, name="b")
    async def on_b(body: bytes, d: Delivery) -> None:
        await d.db.execute("INSERT INTO effects_b (msg) VALUES (%s)", (d.message_id,))

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)

    def dump() -> None:  # SIGUSR1: what the app holds, and where its tasks wait
        print(app.stats(), file=sys.stderr, flush=True)
        for t in asyncio.all_tasks():
            t.print_stack(file=sys.stderr)
        sys.stderr.flush()

    loop.add_signal_handler(signal.SIGUSR1, dump)
    while True:
        try:
            await app.start()
            break
        except Exception:
            await asyncio.sleep(0.5)
    print("ready", flush=True)
    await stop.wait()
    await app.stop()


def main() -> None:
    url, dsn, qa, qb, log_path = sys.argv[1:6]
    kind = sys.argv[6] if len(sys.argv) > 6 else "sync"
    handler = logging.FileHandler(log_path)  # every record written (flushed) at once
    handler.setLevel(logging.INFO)
    handler.setFormatter(logging.Formatter(f"%(process)d {kind} %(message)s"))
    lg = logging.getLogger("ackkit.inbox")
    lg.setLevel(logging.INFO)
    lg.addHandler(handler)
    if kind == "async":  # SIGUSR1: the app's stats and its tasks' stacks (run_async)
        asyncio.run(run_async(url, Inbox(dsn), qa, qb))
    else:
        faulthandler.register(signal.SIGUSR1, all_threads=True)  # the threads' stacks
        run_sync(url, Inbox(dsn), qa, qb)


if __name__ == "__main__":
    main()
