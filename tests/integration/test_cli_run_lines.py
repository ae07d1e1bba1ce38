"""`ackkit run`'s stderr: log lines carry one "ackkit" (the logger's name), not
"ackkit: ackkit: ...", and a graceful stop ends with a "stopped" line with the counts
(App and AsyncApp, on the kit's real broker)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]

MODULE = """
import os
from ackkit import {cls}

app = {cls}(os.environ["T_URL"], shutdown_timeout=5)

@app.listener(os.environ["T_QUEUE"])
{asyn}def handle(order: dict) -> None:
    if order["id"] == 3:
        raise ValueError("order 3 is bad")
"""


@pytest.mark.parametrize("cls", ["App", "AsyncApp"])
def test_run_logs_once_prefixed_and_ends_with_a_stopped_line(
    rabbitmq: Any, queue_factory: Any, tmp_path: Path, cls: str
) -> None:
    q = queue_factory(broker=rabbitmq)
    asyn = "async " if cls == "AsyncApp" else ""
    (tmp_path / "svc.py").write_text(MODULE.format(cls=cls, asyn=asyn))
    env = {**os.environ, "T_URL": rabbitmq.url, "T_QUEUE": q, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "ackkit.cli", "run", "svc:app"],
        cwd=tmp_path,
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        rabbitmq.wait_for(q, consumers=1, timeout=30)
        for i in (1, 2, 3):
            rabbitmq.publish(q, {"id": i})
        rabbitmq.wait_for(f"{q}.dlq", ready=1, timeout=15)
        rabbitmq.wait_for(q, ready=0, unacked=0, timeout=15)
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert "ackkit: ackkit:" not in err, err
    assert re.search(r"INFO +ackkit: 1 (async )?listener\(s\) consuming", err), err
    lines = err.strip().splitlines()
    assert lines[-1] == (
        "ackkit: stopped svc:app: 3 received, 2 acked, 0 retried, 1 dead-lettered, "
        "0 requeued, 0 returned"
    ), err
