"""A message that kills its consumer on every delivery stops at max_attempts on a
classic queue (the redelivered flag does not count: it looped forever)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from _retry_support import Worker, drain, header_text, publish, read_log, wait_until

from ackkit._core import headers as H

pytestmark = pytest.mark.integration


def test_message_that_kills_its_consumer_stops_at_max_attempts_on_a_classic_queue(
    rabbitmq: Any, fresh_queue: str, tmp_path: Path
) -> None:
    """Killed inside the handler at every delivery. The redelivered flag only says
    "again", so the message came back as attempt 2 forever; now each redelivery is
    stamped with its attempt and the third loss sends it to the DLQ."""
    q, dlq = fresh_queue, f"{fresh_queue}.dlq"
    log = tmp_path / "calls.jsonl"
    publish(rabbitmq.url, q, b"{}", message_id="killer", declare=True)
    calls: list[int] = []
    for _ in range(6):
        before = len([e for e in read_log(log) if "attempt" in e])
        w = Worker(rabbitmq.url, q, log, "--hold", "30", "--max-attempts", "3").start()
        try:
            wait_until(
                lambda w=w, b=before: len(w.invocations()) > b or rabbitmq.counts(dlq).ready,
                timeout=15,
            )
            calls = [c["attempt"] for c in w.invocations()]
            if len(calls) == before:  # not run: it went to the DLQ
                rabbitmq.wait_for(q, ready=0, unacked=0, timeout=10)
                break
            w.kill()  # inside the 30 s hold: the delivery dies with its consumer
            rabbitmq.wait_for(q, unacked=0, consumers=0, timeout=10)
        finally:
            w.kill()
    else:
        raise AssertionError(f"the message loops: attempts {calls}")
    print(f"FIG crash-redelivery classic: attempts {calls}")
    assert calls == [1, 2, 3]
    [(props, _)] = drain(rabbitmq.url, dlq)
    assert header_text(props.headers[H.REASON]) == "attempts exhausted (3 of 3, last one lost)"
