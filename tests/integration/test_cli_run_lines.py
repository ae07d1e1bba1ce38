"""`ackkit run`'s stderr: log lines carry one "ackkit" (the logger's name), not
"ackkit: ackkit: ...", and a graceful stop ends with a "stopped" line with the counts
(App and AsyncApp, on the kit's real broker)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable
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


def run_until_sigterm(
    target: str, cwd: Path, env: dict[str, str], meanwhile: Callable[[], None]
) -> tuple[int, str, str]:
    """`ackkit run TARGET` in `cwd`: `meanwhile()` while it runs, then SIGTERM; its exit
    code, stdout and stderr (killed if anything failed on the way)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "ackkit.cli", "run", target],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        meanwhile()
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return proc.returncode, out, err


@pytest.mark.parametrize("cls", ["App", "AsyncApp"])
def test_run_logs_once_prefixed_and_ends_with_a_stopped_line(
    rabbitmq: Any, queue_factory: Any, tmp_path: Path, cls: str
) -> None:
    q = queue_factory(broker=rabbitmq)
    asyn = "async " if cls == "AsyncApp" else ""
    (tmp_path / "svc.py").write_text(MODULE.format(cls=cls, asyn=asyn))
    env = {**os.environ, "T_URL": rabbitmq.url, "T_QUEUE": q, "PYTHONPATH": str(REPO)}

    def meanwhile() -> None:
        rabbitmq.wait_for(q, consumers=1, timeout=30)
        for i in (1, 2, 3):
            rabbitmq.publish(q, {"id": i})
        rabbitmq.wait_for(f"{q}.dlq", ready=1, timeout=15)
        rabbitmq.wait_for(q, ready=0, unacked=0, timeout=15)

    code, _out, err = run_until_sigterm("svc:app", tmp_path, env, meanwhile)
    assert code == 0, err
    assert "ackkit: ackkit:" not in err, err
    assert re.search(r"INFO +ackkit: 1 (async )?listener\(s\) consuming", err), err
    lines = err.strip().splitlines()
    assert lines[-1] == (
        "ackkit: stopped svc:app: 3 received, 2 acked, 0 retried, 1 dead-lettered, "
        "0 requeued, 0 returned"
    ), err


def test_run_calls_the_factory_of_the_running_guide(
    rabbitmq: Any, queue_factory: Any, tmp_path: Path
) -> None:
    """docs/guide/running.md's "An app factory" example, as the page shows it (its queue
    name made unique): `ackkit run svc:create_app` calls the factory, whose app consumes
    (the broker shows its consumer, then the queue drained), handles each order and
    stops on SIGTERM with the stopped line; a factory that needs arguments is refused."""
    from tests.docs._blocks import DOCS, blocks

    found = [b for b in blocks(DOCS / "guide" / "running.md") if "def create_app" in b.code]
    assert len(found) == 1, "docs/guide/running.md shows no app factory (def create_app)"
    block = found[0]
    q = queue_factory(broker=rabbitmq)
    assert block.code.count('"orders"') == 1
    (tmp_path / "svc.py").write_text(block.code.replace('"orders"', repr(q)))
    (tmp_path / "svc_args.py").write_text(
        "from svc import create_app as make\n\ndef create_app(name):\n    return make()\n"
    )
    env = {**os.environ, "AMQP_URL": rabbitmq.url, "PYTHONPATH": str(REPO)}

    def meanwhile() -> None:
        rabbitmq.wait_for(q, consumers=1, timeout=30)
        rabbitmq.publish_many(q, [{"id": 1}, {"id": 2}])
        rabbitmq.wait_for(q, ready=0, unacked=0, timeout=15)

    code, out, err = run_until_sigterm("svc:create_app", tmp_path, env, meanwhile)
    assert code == 0, err
    assert out.splitlines() == ["order 1", "order 2"], out
    assert err.strip().splitlines()[-1] == (
        "ackkit: stopped svc:create_app: 2 received, 2 acked, 0 retried, 0 dead-lettered, "
        "0 requeued, 0 returned"
    ), err

    refused = subprocess.run(
        [sys.executable, "-m", "ackkit.cli", "run", "svc_args:create_app"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode == 1, refused.stderr
    assert "error: cannot load svc_args:create_app: " in refused.stderr, refused.stderr
