"""Smoke test of the benchmark harness (no timing assertions: numbers are not checked)."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import pytest
from rich.console import Console

from .broker import QueueState, delete_queue, queue_state, reachable
from .harness import CPU_RATIOS, DEFAULT_URL, RATIOS, Config, ratio_key, run_benchmarks

URL = os.environ.get("AMQP_URL", DEFAULT_URL)
CASES = ["pika.noack", "pika.batched", "ackkit.sync.auto"]
CASE_KEYS = {"median", "min", "max", "runs", "cpu_us_per_msg", "status"}


@pytest.fixture
def broker_url(request: pytest.FixtureRequest) -> str:
    """The test kit's broker (ackkit.testing plugin) if loaded, else AMQP_URL / local."""
    try:
        return str(request.getfixturevalue("amqp_url"))
    except pytest.FixtureLookupError:
        pass
    if not reachable(URL):
        pytest.skip(f"no RabbitMQ at {URL}")
    return URL


@pytest.mark.integration
@pytest.mark.timeout(60)
def test_harness_runs_cases_and_leaves_queues_empty(broker_url: str, tmp_path: Path) -> None:
    json_path = tmp_path / "bench.json"
    out = io.StringIO()
    cfg = Config(
        url=broker_url,
        cases=CASES,
        messages=500,
        rounds=1,
        json_path=json_path,
        keep_queues=True,  # so that this test can ask the broker about them
        progress=False,
    )
    run_benchmarks(cfg, Console(file=out, width=120))
    data = json.loads(json_path.read_text())

    queues = [run["queue"] for res in data["cases"].values() for run in res["runs"]]
    try:
        assert set(data) >= {"cases", "ratios", "meta"}
        assert list(data["cases"]) == CASES
        for case_id in ("pika.noack", "pika.batched"):
            res = data["cases"][case_id]
            assert set(res) >= CASE_KEYS
            assert res["status"] == "ok", res
            assert len(res["runs"]) == 1
            assert res["min"] <= res["median"] <= res["max"]
            assert res["median"] > 0
            assert res["cpu_us_per_msg"] > 0
        # ackkit's own case runs the library end to end; its queue is checked below too.
        assert data["cases"]["ackkit.sync.auto"]["status"] == "ok"

        assert set(data["ratios"]) == {ratio_key(n, d) for n, d, _ in RATIOS}
        ratios = data["ratios"]
        assert ratios["ackkit.sync.auto/pika.batched"] > 0  # both sides ran in this run
        assert ratios["ackkit.deadletter/publish.confirm"] is None  # neither side ran
        # on CPU per message too (reference / ackkit), with the goals beside them
        cpu = data["cpu_ratios"]
        keys = {ratio_key(n, d) for n, d, _ in CPU_RATIOS}
        assert set(cpu) == keys == set(data["cpu_ratio_goals"])
        sync = data["cases"]["ackkit.sync.auto"]["cpu_us_per_msg"]
        raw = data["cases"]["pika.batched"]["cpu_us_per_msg"]
        assert cpu["ackkit.sync.auto/pika.batched"] == round(raw / sync, 4)
        assert cpu["ackkit.deadletter/publish.confirm"] is None
        assert data["cases"]["pika.batched"]["runs"][0]["switches_per_msg"] is not None
        meta = data["meta"]
        assert {"date", "broker", "python", "machine", "messages", "rounds"} <= set(meta)
        assert meta["messages"] == 500 and meta["rounds"] == 1
        assert {"nproc", "cpu_model"} <= set(meta["machine"])
        assert "pika.batched" in out.getvalue()

        for case_id in ("pika.noack", "pika.batched", "ackkit.sync.auto"):
            res = data["cases"][case_id]
            assert queue_state(broker_url, res["runs"][0]["queue"]) == QueueState(0, 0)
    finally:
        for queue in queues:
            delete_queue(broker_url, queue)


def test_plot_renders_with_missing_values(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from .plot import write_plot

    report = {
        "cases": {
            "pika.batched": {
                "median": 20_000.0,
                "min": 19_000.0,
                "max": 21_000.0,
                "cpu_us_per_msg": 30.0,
                "status": "ok",
            },
            "ackkit.sync.auto": {
                "median": None,
                "min": None,
                "max": None,
                "cpu_us_per_msg": None,
                "status": "n/a",
            },
        },
        "ratios": {
            ratio_key(n, d): (0.9 if i == 0 else None) for i, (n, d, _) in enumerate(RATIOS)
        },
        "ratio_targets": {ratio_key(n, d): t for n, d, t in RATIOS},
        "meta": {
            "messages": 500,
            "rounds": 1,
            "broker": "3.10",
            "date": "today",
            "machine": {"nproc": 2},
        },
    }
    path = tmp_path / "plot.png"
    assert write_plot(report, path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
