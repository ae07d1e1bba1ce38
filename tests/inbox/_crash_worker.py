"""A consumer process for the inbox crash test (SIGKILLed at random by the test).

argv: amqp_url dsn queue_a queue_b log_path. Listener A records each message in
effects_a and publishes one follow-up to B through the outbox; listener B records the
follow-up in effects_b. Duplicates the inbox absorbs are logged (one line each)."""

from __future__ import annotations

import logging
import signal
import sys
import threading

from ackkit import App, Consumer, Delivery
from ackkit.inbox import Inbox


def main() -> None:
    url, dsn, qa, qb, log_path = sys.argv[1:6]
    handler = logging.FileHandler(log_path)  # every record written (flushed) at once
    handler.setLevel(logging.INFO)
    lg = logging.getLogger("ackkit.inbox")
    lg.setLevel(logging.INFO)
    lg.addHandler(handler)
    app = App(url, connection_name="inbox-crash")
    inbox = Inbox(dsn)

    @app.listener(qa, inbox=inbox, consumer=Consumer(concurrency=4, prefetch=20), name="a")
    def on_a(body: bytes, d: Delivery) -> None:
        d.db.execute("INSERT INTO effects_a (msg) VALUES (%s)", (d.message_id,))
        d.publish(qb, body, message_id=f"{d.message_id}-f")

    @app.listener(qb, inbox=inbox, consumer=Consumer(concurrency=4, prefetch=20), name="b")
    def on_b(body: bytes, d: Delivery) -> None:
        d.db.execute("INSERT INTO effects_b (msg) VALUES (%s)", (d.message_id,))

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    app.start()
    print("ready", flush=True)
    stop.wait()
    app.stop()


if __name__ == "__main__":
    main()
