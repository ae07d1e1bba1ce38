"""The chaos run in its quick mode, inside `make test` (about two minutes)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .run import Settings, run, table

pytestmark = [pytest.mark.chaos, pytest.mark.integration, pytest.mark.timeout(600)]


@pytest.mark.parametrize(
    "runtimes",
    [
        ("sync", "async"),
        pytest.param(
            ("amqp10",),
            marks=pytest.mark.skip(
                reason="AMQP 1.0 (issue 35): in the quick run on 4.3, 15 of the 23 messages "
                "with a header name that is not UTF-8 in the quorum queue leave it with no "
                "dead letter (lost 0 and every other figure as over 0-9-1; without faults "
                "they are all dead-lettered). Not explained yet; run it with "
                "ACKKIT_TEST_RABBITMQ=4.3 python -m tests.chaos --quick --runtimes amqp10"
            ),
        ),
    ],
    ids=["pika-aiopika", "amqp10"],
)
def test_chaos_quick(tmp_path: Path, runtimes: tuple[str, ...]) -> None:
    """The quick chaos run, its consumers on App and AsyncApp, then on the App over AMQP
    1.0 (RabbitMQ 4.x: the 4.3 leg)."""
    s = Settings.quick()
    s.runtimes = runtimes
    result = run(s, tmp_path / "chaos", quiet=True)
    if result.skipped:
        pytest.skip(result.skipped)
    print(table(result))
    (tmp_path / "chaos.json").write_text(json.dumps(result.figures, indent=2))
    f = result.figures
    assert result.passed, table(result)
    assert f["kills"] >= 1 and f["broker_restarts"] >= 1 and f["cuts"] >= 1
    assert (
        f["handled_ok"] + f["good_dead_lettered"]
        >= f["messages"] - f["poison"] - f["bad"] - f["slow"]
    )
