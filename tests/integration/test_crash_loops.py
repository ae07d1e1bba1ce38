"""A message that kills its consumer process every time ends in the DLQ, with the default
Retry (max_attempts=1) too, on classic and quorum queues (issue 20); the messages
prefetched behind it are handled, not dead-lettered. Real worker processes, SIGKILLed
by the message itself; what became of every message is read from the broker."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from _retry_support import Worker, drain, header_text, publish, read_log

from ackkit._core import headers as H

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("queue_type", ["classic", "quorum"])
def test_a_message_that_kills_its_consumer_ends_in_the_dlq_with_one_attempt(
    rabbitmq: Any, fresh_queue: str, tmp_path: Path, queue_type: str
) -> None:
    q, dlq = fresh_queue, f"{fresh_queue}.dlq"
    args = {"x-queue-type": "quorum"} if queue_type == "quorum" else None
    log = tmp_path / "calls.jsonl"
    publish(rabbitmq.url, q, b"{}", message_id="killer", declare=True, arguments=args)
    for i in range(5):
        publish(rabbitmq.url, q, b"{}", message_id=f"ok{i}")
    worker_args = ["--max-attempts", "1", "--succeed-at", "1", "--die-on", "killer"]
    worker_args += ["--queue-type", queue_type, "--prefetch", "10"]
    w: Worker | None = None
    # Each run of the killer kills one worker; restart workers until every message has
    # ended somewhere. A kill between a charged copy's confirm and its original's ack
    # can leave a twin, which may kill one more worker before it is dead-lettered too.
    max_starts = 4 * (1 + H.LOST_BOUND)
    starts = 0
    deadline = time.monotonic() + 180
    try:
        while True:
            if w is None or w.proc is None or w.proc.poll() is not None:
                if starts >= max_starts:
                    runs = [
                        (e["mid"], e["pid"] % 1000, e["redelivered"])
                        for e in read_log(log)
                        if "mid" in e
                    ]
                    raise AssertionError(f"the message loops: {runs}")
                starts += 1
                try:
                    w = Worker(rabbitmq.url, q, log, *worker_args).start()
                except RuntimeError as exc:  # killed by the message before it said "ready"
                    assert "exited with -9" in str(exc), exc
                    w = None
                    continue
            c = rabbitmq.counts(q)
            if c.ready == 0 and c.unacked == 0 and rabbitmq.counts(dlq).ready:
                break
            assert time.monotonic() < deadline, f"not drained: {c}"
            time.sleep(0.05)
    finally:
        if w is not None:
            w.stop()
    runs = [e["mid"] for e in read_log(log) if "attempt" in e]
    print(f"FIG crash-loop {queue_type}: killer ran {runs.count('killer')}x, {starts} workers")
    # 1 + LOST_BOUND when each of its runs after a redelivery is the charged one; a run
    # while another redelivered message's charged copy was pending goes uncounted
    assert 1 + H.LOST_BOUND <= runs.count("killer") <= max_starts
    assert sorted(m for m in set(runs) if m != "killer") == [f"ok{i}" for i in range(5)]
    letters = drain(rabbitmq.url, dlq)
    print(
        f"FIG crash-loop {queue_type}: dlq letters={len(letters)}, ok handled={len(set(runs)) - 1}"
    )
    # Twins (see above): a twin splits off only at a killer run and adds at most one
    # letter, so the letters are at most the killer runs beyond the LOST_BOUND deaths one
    # lineage needs, plus one (the first lineage's letter).
    assert 1 <= len(letters) <= runs.count("killer") - H.LOST_BOUND + 1, (letters, runs)
    for props, _ in letters:
        assert props.message_id == "killer"
        assert header_text(props.headers[H.REASON]) == (
            f"consumer died or lost its connection {H.LOST_BOUND} times while handling it"
        )
