"""The health rule: an internal failure recovers or stops the app visibly, never a zombie.

A bug inside ackkit is simulated by making the core raise when a handler's
outcome is reported (the one call every delivery goes through after its
handler). The app must stop itself: `is_running` turns False, `running()`
raises the failure on exit, an ERROR line names it, and the broker gets the
unsettled delivery back.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest

from ackkit import Delivery
from ackkit._core.listener import ListenerCore
from tests.adversarial.test_handlers import run_until
from tests.contract.conftest import IO, Broker, Runtime

pytestmark = pytest.mark.integration


class InternalBug(RuntimeError):
    pass


def test_an_internal_failure_stops_the_app_visibly(
    runtime: Runtime,
    broker: Broker,
    queue_factory: Any,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    q = queue_factory(declare=True)
    ran: list[int] = []

    async def handle(p: dict[str, int], d: Delivery, io: IO) -> None:
        ran.append(p["id"])

    def broken(self: ListenerCore, *a: Any, **kw: Any) -> Any:
        raise InternalBug("the core broke")

    monkeypatch.setattr(ListenerCore, "handled", broken)
    caplog.set_level(logging.ERROR, "ackkit")
    app = runtime.app()
    runtime.listen(app, q, handle, dict)
    broker.publish(q, [json.dumps({"id": 1})])
    caught = run_until(runtime, app, lambda: not app.is_running)
    assert isinstance(caught, InternalBug), caught
    assert not app.is_running
    assert ran == [1]
    assert any("the core broke" in r.getMessage() for r in caplog.records if r.levelno >= 40)
    monkeypatch.undo()
    # Nothing lost: the broker has the delivery back, and a healthy app handles it.
    broker.wait_for(q, ready=1, unacked=0, timeout=30)
    again = runtime.app()
    runtime.listen(again, q, handle, dict)
    with runtime.running(again):
        broker.wait_for(q, ready=0, unacked=0)
    assert ran == [1, 1]
