"""The ttl_scale marker and the --ttl-scale option reach both in-memory fixtures
(memory_broker and amqp_broker): a 3-attempt broker retry with 1 s and 2 s delays
reaches the DLQ at once, and waits for real without them."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from typing import Any

USER_SUITE = """
import time

import pytest

from ackkit import App, Retry


def time_to_dlq(broker):
    app = App(broker.url)

    @app.listener("orders", retry=Retry(max_attempts=3, initial_interval=1.0))
    def handle(order: dict) -> None:
        raise RuntimeError("payment down")

    started = time.monotonic()
    with app.running():
        broker.publish("orders", {"id": 1})
        broker.wait_for("orders.dlq", ready=1, timeout=30)
    return time.monotonic() - started


@pytest.mark.ttl_scale(0)
def test_marked_memory_broker(memory_broker):
    print("MARKED-MEMORY %.2f" % time_to_dlq(memory_broker))


@pytest.mark.ttl_scale(0)
def test_marked_amqp_broker(amqp_broker):
    print("MARKED-AMQP %.2f" % time_to_dlq(amqp_broker))


def test_unmarked(amqp_broker):
    print("UNMARKED %.2f" % time_to_dlq(amqp_broker))
"""


def run(tmp_path: Any, *args: str) -> dict[str, float]:
    (tmp_path / "test_user.py").write_text(USER_SUITE)
    env = {k: v for k, v in os.environ.items() if k != "ACKKIT_TEST_REAL_BROKER"}
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    found = re.findall(r"(MARKED-MEMORY|MARKED-AMQP|UNMARKED) ([0-9.]+)", out.stdout)
    return {name: float(value) for name, value in found}


def test_the_marker_makes_retry_delays_instant_on_both_fixtures(tmp_path: Any) -> None:
    t = run(tmp_path)
    assert t["MARKED-MEMORY"] < 1.5 and t["MARKED-AMQP"] < 1.5, t
    assert t["UNMARKED"] >= 2.9, t  # 1 s + 2 s in the delay queues, for real


def test_the_option_scales_unmarked_tests(tmp_path: Any) -> None:
    t = run(tmp_path, "--ttl-scale=0")
    assert t["UNMARKED"] < 1.5, t


def test_a_bad_marker_is_a_usage_error(tmp_path: Any) -> None:
    (tmp_path / "test_bad.py").write_text(
        "import pytest\n\n@pytest.mark.ttl_scale(-1)\ndef test_x(memory_broker):\n    pass\n"
    )
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_bad.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode != 0
    assert "ttl_scale must be a number >= 0, got -1" in out.stdout + out.stderr
