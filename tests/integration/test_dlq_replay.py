"""The DLQ tool on a real broker: inspect loses nothing, replay never loses a message."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from typing import Any

import pytest
from _retry_support import REPO, drain, header_text, peek, publish, wait_until

from ackkit import App, Consumer, Delivery, Retry
from ackkit._core import headers as H
from ackkit.dead_letters._queue import DeadLetterQueue, inspect_dead_letters, replay_dead_letters

pytestmark = [pytest.mark.integration, pytest.mark.one_leg]


def fill_dlq(rabbitmq: Any, q: str, n: int, error: type[Exception] = ValueError) -> None:
    """Dead-letter n messages through a failing App: real ackkit dead letters."""
    app = App(rabbitmq.url)

    @app.listener(
        q,
        retry=Retry(max_attempts=2, initial_interval=0.05),
        consumer=Consumer(prefetch=50),
    )
    def h(d: Delivery) -> None:
        kind = error if int(d.message_id or 0) % 2 == 0 else KeyError
        raise kind(f"bug on {d.message_id}")

    with app.running():
        for i in range(n):
            publish(rabbitmq.url, q, json.dumps({"i": i}), message_id=f"{i}")
        rabbitmq.wait_for(f"{q}.dlq", ready=n, timeout=15)
        rabbitmq.wait_for(q, ready=0, unacked=0)


def test_inspect_reads_without_removing(rabbitmq: Any, fresh_queue: str) -> None:
    q = fresh_queue
    fill_dlq(rabbitmq, q, 4)
    letters = inspect_dead_letters(rabbitmq.url, f"{q}.dlq", limit=3)
    assert [d.message_id for d in letters] == ["0", "1", "2"]
    d0, d1 = letters[0], letters[1]
    assert d0.source == "ackkit" and d0.reason == "attempts exhausted (2 of 2)"
    assert d0.error_type == "ValueError" and d1.error_type == "KeyError"
    assert d0.attempts == 2 and d0.original_queue == q and d0.dead_lettered_at
    rabbitmq.wait_for(f"{q}.dlq", ready=4, unacked=0)
    # Order kept: the head is still message 0.
    assert [p.message_id for p, _ in peek(rabbitmq.url, f"{q}.dlq")] == ["0", "1", "2", "3"]


def test_inspect_describes_broker_dead_letters(rabbitmq: Any, fresh_queue: str) -> None:
    """A message the broker dead-lettered (queue DLX, here an expired TTL) is described
    from x-death: reason and original queue."""
    q, dlq = fresh_queue, f"{fresh_queue}.dlq"
    publish(rabbitmq.url, dlq, b"", declare=True)
    drain(rabbitmq.url, dlq)
    args = {"x-message-ttl": 1, "x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq}
    publish(rabbitmq.url, q, b"{}", declare=True, arguments=args, message_id="ttl")
    rabbitmq.wait_for(dlq, ready=1)
    (d,) = inspect_dead_letters(rabbitmq.url, dlq)
    assert (d.source, d.reason, d.original_queue, d.message_id) == ("broker", "expired", q, "ttl")


def test_replay_to_origin_then_processed_normally(rabbitmq: Any, fresh_queue: str) -> None:
    q = fresh_queue
    fixed = threading.Event()
    processed: list[tuple[str | None, int, Any, Any]] = []
    app = App(rabbitmq.url)

    @app.listener(q, retry=Retry(max_attempts=2, initial_interval=0.05))
    def h(d: Delivery) -> None:
        if not fixed.is_set():
            raise ValueError("bug")
        processed.append(
            (d.message_id, d.attempt, d.headers.get(H.REPLAYED), d.headers.get("tenant"))
        )

    with app.running():
        for i in range(5):
            publish(
                rabbitmq.url, q, json.dumps({"i": i}), message_id=f"m{i}", headers={"tenant": "x"}
            )
        rabbitmq.wait_for(f"{q}.dlq", ready=5, timeout=10)
        fixed.set()  # the bug is fixed and deployed
        report = replay_dead_letters(rabbitmq.url, f"{q}.dlq")
        assert (report.examined, report.replayed, report.left, report.remaining) == (5, 5, 0, 0)
        assert report.targets == {q: 5}
        assert wait_until(lambda: len(processed) == 5, timeout=10)
        rabbitmq.wait_for(q, ready=0, unacked=0)
    assert sorted(processed) == [(f"m{i}", 1, 1, "x") for i in range(5)]
    assert rabbitmq.counts(f"{q}.dlq").total == 0
    again = replay_dead_letters(rabbitmq.url, f"{q}.dlq")  # idempotent: nothing left to do
    assert (again.examined, again.replayed, again.remaining) == (0, 0, 0)


def test_replayed_copy_has_fresh_attempts_and_no_error(rabbitmq: Any, fresh_queue: str) -> None:
    q = fresh_queue
    fill_dlq(rabbitmq, q, 1)
    with DeadLetterQueue(rabbitmq.url, f"{q}.dlq") as dlq:
        report = dlq.replay(to=f"{q}.parking")
    assert report.failed == 1  # no such queue: unroutable, the dead letter stays
    rabbitmq.wait_for(f"{q}.dlq", ready=1, unacked=0)
    publish(rabbitmq.url, f"{q}.parking", b"", declare=True)
    drain(rabbitmq.url, f"{q}.parking")
    with DeadLetterQueue(rabbitmq.url, f"{q}.dlq") as dlq:
        report = dlq.replay(to=f"{q}.parking")
    assert report.replayed == 1
    (props, body) = drain(rabbitmq.url, f"{q}.parking")[0]
    assert json.loads(body) == {"i": 0}
    assert props.message_id == "0"
    h = props.headers
    assert h[H.REPLAYED] == 1 and H.REPLAYED_AT in h
    for gone in (H.ATTEMPT, H.ATTEMPTS, H.REASON, H.ERROR_TYPE, H.ERROR_TRACEBACK, "x-death"):
        assert gone not in h
    assert header_text(h[H.ORIGINAL_ROUTING_KEY]) == q  # where it first came from stays


def test_replay_filters_leave_the_rest_in_place(rabbitmq: Any, fresh_queue: str) -> None:
    q = fresh_queue
    fill_dlq(rabbitmq, q, 6)  # even ids ValueError, odd ids KeyError
    publish(rabbitmq.url, f"{q}.other", b"", declare=True)
    drain(rabbitmq.url, f"{q}.other")
    r = replay_dead_letters(rabbitmq.url, f"{q}.dlq", to=f"{q}.other", error_type="KeyError")
    assert (r.examined, r.replayed, r.skipped) == (6, 3, 3)
    r = replay_dead_letters(
        rabbitmq.url, f"{q}.dlq", to=f"{q}.other", message_ids=["2"], reason_contains="EXHAUSTED"
    )
    assert r.replayed == 1
    r = replay_dead_letters(rabbitmq.url, f"{q}.dlq", to=f"{q}.other", reason_contains="nope")
    assert r.replayed == 0 and r.skipped == 2
    other = sorted(p.message_id for p, _ in drain(rabbitmq.url, f"{q}.other"))
    assert other == ["1", "2", "3", "5"]
    assert [p.message_id for p, _ in peek(rabbitmq.url, f"{q}.dlq")] == ["0", "4"]
    r = replay_dead_letters(rabbitmq.url, f"{q}.dlq", to=f"{q}.other", limit=1)
    assert r.replayed == 1 and r.remaining == 1


def test_replay_interrupted_by_an_exception_loses_nothing(rabbitmq: Any, fresh_queue: str) -> None:
    q = fresh_queue
    fill_dlq(rabbitmq, q, 6)
    publish(rabbitmq.url, f"{q}.to", b"", declare=True)
    drain(rabbitmq.url, f"{q}.to")

    def crash_after_three(_dl: Any, _target: str) -> None:
        crash_after_three.n += 1  # type: ignore[attr-defined]
        if crash_after_three.n == 3:  # type: ignore[attr-defined]
            raise RuntimeError("operator pressed ctrl-c")

    crash_after_three.n = 0  # type: ignore[attr-defined]
    with pytest.raises(RuntimeError), DeadLetterQueue(rabbitmq.url, f"{q}.dlq") as dlq:
        dlq.replay(to=f"{q}.to", on_replayed=crash_after_three)
    rabbitmq.wait_for(f"{q}.dlq", ready=3, unacked=0)
    rabbitmq.wait_for(f"{q}.to", ready=3)
    moved = {p.message_id for p, _ in peek(rabbitmq.url, f"{q}.to")}
    left = {p.message_id for p, _ in peek(rabbitmq.url, f"{q}.dlq")}
    assert moved | left == {str(i) for i in range(6)} and not moved & left


KILLABLE = """
import sys, time
from ackkit.dead_letters._queue import DeadLetterQueue
url, queue, to = sys.argv[1:4]
def slow(dl, target):
    print(dl.message_id, flush=True)
    time.sleep(0.05)
with DeadLetterQueue(url, queue) as dlq:
    dlq.replay(to=to, on_replayed=slow)
"""


def test_replay_killed_midway_loses_nothing(rabbitmq: Any, fresh_queue: str) -> None:
    """SIGKILL in the middle of a replay: every message is in the DLQ or the target
    (one may be in both: the kill can land between the confirm and the ack)."""
    q, dlq, to = fresh_queue, f"{fresh_queue}.dlq", f"{fresh_queue}.to"
    n = 40
    publish(rabbitmq.url, to, b"", declare=True)
    drain(rabbitmq.url, to)
    publish(rabbitmq.url, dlq, b"", declare=True)
    drain(rabbitmq.url, dlq)
    for i in range(n):
        publish(
            rabbitmq.url,
            dlq,
            json.dumps({"i": i}),
            message_id=str(i),
            headers={H.REASON: "test", H.ORIGINAL_QUEUE: q},
        )
    proc = subprocess.Popen(
        [sys.executable, "-c", KILLABLE, rabbitmq.url, dlq, to],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    for _ in range(10):
        proc.stdout.readline()
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    proc.stdout.close()
    rabbitmq.wait_for(dlq, unacked=0, consumers=0)
    moved = [p.message_id for p, _ in peek(rabbitmq.url, to)]
    left = [p.message_id for p, _ in peek(rabbitmq.url, dlq)]
    assert 10 <= len(moved) < n
    assert set(moved) | set(left) == {str(i) for i in range(n)}
    assert len(set(moved) & set(left)) <= 1
    # Finishing the replay afterwards gets everything over; duplicates at most one.
    r = replay_dead_letters(rabbitmq.url, dlq, to=to)
    assert r.remaining == 0
    final = [p.message_id for p, _ in drain(rabbitmq.url, to)]
    assert set(final) == {str(i) for i in range(n)} and len(final) - n <= 1


def test_replay_wait_time(rabbitmq: Any, fresh_queue: str) -> None:
    """200 dead letters replay in well under a few seconds (confirm per message)."""
    q, dlq = fresh_queue, f"{fresh_queue}.dlq"
    publish(rabbitmq.url, q, b"", declare=True)
    publish(rabbitmq.url, dlq, b"", declare=True)
    drain(rabbitmq.url, q)
    drain(rabbitmq.url, dlq)
    import ackkit

    with ackkit.connect(rabbitmq.url) as c:
        for i in range(200):
            c.publish(dlq, b"{}", message_id=str(i), headers={H.REASON: "x", H.ORIGINAL_QUEUE: q})
    t0 = time.monotonic()
    r = replay_dead_letters(rabbitmq.url, dlq)
    assert r.replayed == 200
    print(f"FIG replay of 200 letters: {time.monotonic() - t0:.2f} s")  # measured, not asserted
    rabbitmq.wait_for(q, ready=200)


def test_example_retry_dead_letter_replay(rabbitmq: Any) -> None:
    """examples/retry_dead_letter.py runs (bounded by the subprocess timeout) and does what
    it prints."""
    t0 = time.monotonic()
    res = subprocess.run(
        [sys.executable, "-m", "examples.retry_dead_letter", rabbitmq.url],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    print(f"FIG examples.retry_dead_letter: {time.monotonic() - t0:.2f} s")  # not asserted
    out = res.stdout
    result = json.loads(out[out.index("\n{") + 1 :])
    assert result["attempts"] == {"p1": [1, 2], "p2": [1, 2, 3, 1], "p3": [1]}
    assert sorted(d["id"] for d in result["dead_lettered"]) == ["p2", "p3"]
    assert result["replayed"] == 1 and result["paid"] == ["p1", "p2"]
    assert result["left_in_dlq"] == ["p3"]
    assert "attempts exhausted (3 of 3)" in out
    assert "non-retryable __main__.InvalidPayment; __main__.InvalidPayment: " in out
