"""Bounded retry, then the dead-letter queue, then replay once the cause is fixed.

Three payments go to a listener whose payment gateway is flaky:

- `p1` times out once and goes through on attempt 2 (a broker-delayed retry);
- `p2` times out on every attempt: after 3 attempts it is dead-lettered to
  `example.payments.dlq` with the error, the traceback and the attempt count;
- `p3` is invalid (a fatal error): dead-lettered at once, never retried.

Then the gateway is "fixed" and only the dead letters that failed with
GatewayTimeout are replayed to their origin queue; p2 is processed on a fresh
attempt 1, p3 stays in the DLQ for a human. The same with the command line:

    ackkit dlq inspect example.payments.dlq
    ackkit dlq replay example.payments.dlq --error-type GatewayTimeout

Run: python -m examples.retry_dead_letter [AMQP_URL]
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time
from typing import Any

import pika
import pika.exceptions

from ackkit import App, Consumer, Delivery, Retry, RetryStrategy, connect
from ackkit.dead_letters import DeadLetterQueue, ReplayFilter

QUEUE = "example.payments"
DLQ = f"{QUEUE}.dlq"
RETRY_QUEUE = QUEUE + ".retry.{}ms"
DEFAULT_URL = "amqp://guest:guest@127.0.0.1:5672/%2f"


class GatewayTimeout(Exception):
    """The payment gateway did not answer in time (transient: worth a retry)."""


class InvalidPayment(Exception):
    """The payment can never succeed (fatal: dead-letter at once)."""


RETRY = Retry(
    max_attempts=3,
    initial_interval=0.2,
    multiplier=2.0,
    strategy=RetryStrategy.BROKER,
    fatal=(InvalidPayment,),
)


def _delete(url: str, *queues: str) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(url))
    try:
        for q in queues:
            ch = conn.channel()
            with contextlib.suppress(pika.exceptions.ChannelClosedByBroker):
                ch.queue_delete(q)
    finally:
        conn.close()


def _wait(pred: Any, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.02)
    return bool(pred())


def main(url: Any = DEFAULT_URL) -> dict[str, Any]:
    """Run the scenario against `url` (or anything with a `.url`, e.g. a test-kit broker)."""
    url = str(getattr(url, "url", url))
    delay_queues = [RETRY_QUEUE.format(ms) for ms in RETRY.delay_tiers_ms()]
    _delete(url, QUEUE, DLQ, *delay_queues)
    gateway_up = threading.Event()
    calls: list[tuple[str, int]] = []
    paid: list[str] = []
    lock = threading.Lock()
    t0 = time.monotonic()

    app = App(url)

    @app.listener(QUEUE, retry=RETRY, consumer=Consumer(prefetch=10))
    def pay(payment: dict[str, Any], d: Delivery) -> None:
        pid = str(payment["id"])
        with lock:
            calls.append((pid, d.attempt))
        print(f"  {time.monotonic() - t0:5.2f}s  {pid} attempt {d.attempt}")
        if payment.get("amount", 0) <= 0:
            raise InvalidPayment(f"{pid}: amount must be positive")
        if not gateway_up.is_set() and (pid == "p2" or d.attempt == 1):
            raise GatewayTimeout(f"{pid}: gateway did not answer within 2 s")
        with lock:
            paid.append(pid)

    with app.running():
        with connect(url) as c:
            for pid, amount in (("p1", 10), ("p2", 20), ("p3", 0)):
                c.publish(QUEUE, json.dumps({"id": pid, "amount": amount}), message_id=pid)
        print("retrying (broker delay queues), then dead-lettering:")
        with DeadLetterQueue(url, DLQ) as dlq:
            _wait(lambda: dlq.count() == 2 and "p1" in paid)
            print(f"\n{DLQ}: {dlq.count()} dead letter(s)")
            dead = dlq.inspect()
            for dl in dead:
                print(
                    f"  {dl.message_id}: {dl.reason}; {dl.error_type}: {dl.error_message} "
                    f"(attempts {dl.attempts}, from {dl.original_queue})"
                )

            print("\ngateway fixed; replaying the GatewayTimeout dead letters:")
            gateway_up.set()
            report = dlq.replay(select=ReplayFilter(error_type="GatewayTimeout"))
            print(
                f"  examined {report.examined}, replayed {report.replayed} to "
                f"{report.targets}, left {report.left} in {DLQ}"
            )
            _wait(lambda: "p2" in paid)
            left = [dl.message_id for dl in dlq.inspect()]
        stats = app.stats()[f"{QUEUE}:pay"]
    print(f"\npaid {sorted(paid)}; still dead-lettered {left}; counters {stats}")
    attempts: dict[str, list[int]] = {}
    for pid, attempt in calls:
        attempts.setdefault(pid, []).append(attempt)
    _delete(url, QUEUE, DLQ, *delay_queues)
    return {
        "attempts": attempts,
        "dead_lettered": [
            {"id": dl.message_id, "reason": dl.reason, "error_type": dl.error_type} for dl in dead
        ],
        "replayed": report.replayed,
        "paid": sorted(paid),
        "left_in_dlq": left,
        "seconds": round(time.monotonic() - t0, 2),
    }


if __name__ == "__main__":
    result = main(sys.argv[1] if len(sys.argv) > 1 else os.environ.get("AMQP_URL", DEFAULT_URL))
    print(json.dumps(result, indent=2))
