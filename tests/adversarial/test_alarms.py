"""Memory and disk alarms (the broker blocks publishers) on the test kit's own node.

While an alarm is on, RabbitMQ stops reading from a connection as soon as it
publishes: a copy (dead letter, retry) or an app message gets no confirm. What
must hold: nothing is acked before its copy is confirmed (the broker keeps every
original), stop() still ends in bounded time, pull mode's publish timeouts hold
and raise PublishNotConfirmed, and close() does not hang. Asserted from the
broker: queue counts and the dead-letter queue's contents.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import pytest

import ackkit
from ackkit import Consumer, Delivery
from ackkit._core.stop_budget import MAX_OVERRUN
from ackkit.errors import PublishNotConfirmed
from ackkit.pull import AsyncPullConnection, PullConnection
from tests.contract.conftest import IO, Broker, Runtime, eventually

# make test's two broker legs share out each test's two runs (tests/conftest.py): each leg
# runs one of them; together, every runtime with every alarm.
pytestmark = [pytest.mark.integration, pytest.mark.legs_share()]

Alarm = Callable[[], AbstractContextManager[None]]

ALARMS = {
    # (raise it, clear it): expressions evaluated on the node (the handle's eval_erlang:
    # erl_call where the kit owns it, milliseconds; else rabbitmqctl eval)
    "memory": (
        "vm_memory_monitor:set_vm_memory_high_watermark(0.0000001)",
        "vm_memory_monitor:set_vm_memory_high_watermark(0.4)",
    ),
    "disk": (
        "rabbit_disk_monitor:set_disk_free_limit(100000000000000)",
        "rabbit_disk_monitor:set_disk_free_limit(50000000)",
    ),
}


def _alarms_on(broker: Broker) -> str:
    return broker.handle.eval_erlang("rabbit_alarm:get_alarms()")


@pytest.fixture(params=sorted(ALARMS))
def alarm(request: pytest.FixtureRequest, broker: Broker) -> Iterator[Alarm]:
    """A context manager that raises the alarm on the kit's own node, and clears it."""
    if not getattr(broker.handle, "own", False):
        pytest.skip("raising an alarm needs the test kit's own node")
    on, off = ALARMS[request.param]

    @contextmanager
    def raised() -> Iterator[None]:
        broker.handle.eval_erlang(on)
        try:
            eventually(lambda: _alarms_on(broker) != "[]", timeout=30, what="the alarm")
            yield
        finally:
            broker.handle.eval_erlang(off)
            eventually(lambda: _alarms_on(broker) == "[]", timeout=30, what="no alarm")

    yield raised
    broker.handle.eval_erlang(off)


# Both alarms block a publishing connection the same way (connection.blocked, then no
# confirm); what differs is the broker's side, which `alarm` checks before it yields. So
# each test runs twice, not four times: both runtimes and both alarms, paired, and the
# pairs alternate between the tests so that every combination runs in the module.
PAIRS = ("runtime", "alarm")
SYNC_MEMORY = pytest.mark.parametrize(PAIRS, [("sync", "memory"), ("async", "disk")], indirect=True)
SYNC_DISK = pytest.mark.parametrize(PAIRS, [("sync", "disk"), ("async", "memory")], indirect=True)


def bodies(n: int, start: int = 0) -> list[str | bytes]:
    return [json.dumps({"id": i}) for i in range(start, start + n)]


@SYNC_MEMORY
def test_pull_publish_timeout_holds_and_close_is_bounded(
    runtime: Runtime, broker: Broker, queue_factory: Any, alarm: Alarm
) -> None:
    q = queue_factory(declare=True)
    url = broker.handle.url
    with alarm():
        t = time.monotonic()
        if not runtime.is_async:
            conn = PullConnection(url)
            with pytest.raises(PublishNotConfirmed, match="no confirm within 3 s"):
                conn.publish(q, {"id": 1}, timeout=3)
            took = time.monotonic() - t
            t = time.monotonic()
            conn.close()
        else:
            lt = runtime.lt  # type: ignore[attr-defined]
            aconn = AsyncPullConnection(url)
            lt.run(aconn.open())
            with pytest.raises(PublishNotConfirmed, match="no confirm within 3 s"):
                lt.run(aconn.publish(q, {"id": 1}, timeout=3))
            took = time.monotonic() - t
            t = time.monotonic()
            lt.run(aconn.close())
        closed = time.monotonic() - t
        print(f"FIG pull-timeout {runtime.kind}: raised after {took:.2f} s, close {closed:.2f} s")
        # Not before the timeout; bounded (a hang would be forever), with room for a loaded
        # machine.
        assert 2.5 < took < 20, took
        assert closed < 30, closed
    # The publish may or may not have been stored (PublishNotConfirmed says so): at most one.
    time.sleep(1)
    assert broker.counts(q).total <= 1


@SYNC_DISK
def test_no_original_is_acked_before_its_copy_is_confirmed_and_stop_is_bounded(
    runtime: Runtime,
    broker: Broker,
    queue_factory: Any,
    alarm: Alarm,
    caplog: pytest.LogCaptureFixture,
) -> None:
    q = queue_factory(declare=True)
    ran: list[int] = []

    async def fail(p: dict[str, int], d: Delivery, io: IO) -> None:
        ran.append(p["id"])
        raise ValueError("boom")  # max_attempts=1: a dead-letter copy, then the ack

    broker.publish(q, bodies(10))
    app = runtime.app(shutdown_timeout=5)
    runtime.listen(app, q, fail, dict, consumer=Consumer(prefetch=10))
    with alarm():
        with runtime.running(app):
            broker.wait_for(q, consumers=1, timeout=30)
            eventually(lambda: len(ran) >= 1, timeout=30)
            time.sleep(3)
            c = broker.counts(q)
            print(f"FIG alarm-copies {runtime.kind}: queue={c.total} of 10, runs={len(ran)}")
            assert c.total == 10, c  # every original is still the broker's
            assert broker.counts(f"{q}.dlq").total == 0
            # ackkit names the alarm in its own words (the broker's connection.blocked)
            blocked = [
                r for r in caplog.records if "the broker blocked connection" in r.getMessage()
            ]
            assert blocked and blocked[0].levelno == logging.WARNING, caplog.text[-2000:]
            t = time.monotonic()
            # runtime.running's exit stops the app, alarm still on
        took = time.monotonic() - t
        print(f"stop under the alarm took {took:.2f} s ({runtime.kind})")
        assert broker.counts(q).total + broker.counts(f"{q}.dlq").total >= 10
    # Once the alarm is over, a healthy app dead-letters all of them: nothing lost.
    again = runtime.app(shutdown_timeout=5)
    runtime.listen(again, q, fail, dict, consumer=Consumer(prefetch=10))
    with runtime.running(again):
        broker.wait_for(q, ready=0, unacked=0, timeout=30)
    letters = broker.take_all(f"{q}.dlq")
    ids = {json.loads(m.body)["id"] for m in letters}
    print(f"FIG alarm-copies {runtime.kind}: dlq after the alarm={len(ids)} of 10")
    assert ids == set(range(10))
    # A run under the alarm counts (its copy never reached the broker): the reason says so.
    reasons = {_text(m.headers["ackkit-reason"]) for m in letters}
    assert reasons <= {
        "attempts exhausted (1 of 1)",
        "attempts exhausted (2 of 1: 1 more after an outcome that did not reach the broker)",
    }, reasons
    # shutdown_timeout + the stop budget's overrun, + room for a loaded machine (a hung stop
    # under the alarm never ends)
    assert took < 5 + MAX_OVERRUN + 10, took


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


SERVICE = """
import os
from ackkit import App, AsyncApp, Consumer, Delivery

KIND, URL, QUEUE = os.environ["T_KIND"], os.environ["T_URL"], os.environ["T_QUEUE"]
app = (App if KIND == "sync" else AsyncApp)(URL, shutdown_timeout=5)

if KIND == "sync":
    @app.listener(QUEUE, consumer=Consumer(prefetch=10))
    def fail(d: Delivery) -> None:
        raise ValueError("boom")
else:
    @app.listener(QUEUE, consumer=Consumer(prefetch=10))
    async def fail(d: Delivery) -> None:
        raise ValueError("boom")
"""


@SYNC_MEMORY
def test_sigterm_under_an_alarm_stops_in_bounded_time_and_acks_nothing_uncopied(
    runtime: Runtime, broker: Broker, queue_factory: Any, alarm: Alarm, tmp_path: Path
) -> None:
    """`ackkit run` under SIGTERM while the broker blocks the app's dead-letter copies."""
    q = queue_factory(declare=True)
    broker.publish(q, bodies(10))
    (tmp_path / "svc.py").write_text(SERVICE)
    env = {
        **os.environ,
        "T_KIND": runtime.kind,
        "T_URL": broker.handle.url,
        "T_QUEUE": q,
        "PYTHONPATH": str(Path(ackkit.__file__).parent.parent),
    }
    with alarm():
        proc = subprocess.Popen(
            [sys.executable, "-m", "ackkit.cli", "run", "svc:app"],
            cwd=tmp_path,
            env=env,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            broker.wait_for(q, consumers=1, timeout=60)
            eventually(lambda: broker.counts(q).unacked > 0, timeout=30)
            time.sleep(2)
            assert broker.counts(q).total == 10  # every original is still the broker's
            t = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            _out, err = proc.communicate(timeout=60)
            took = time.monotonic() - t
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        print(f"SIGTERM under the alarm: exited after {took:.2f} s ({runtime.kind})")
        last = err.strip().splitlines()[-1:]
        print(f"FIG sigterm-alarm {runtime.kind}: queue={broker.counts(q).total} of 10, {last}")
        # shutdown_timeout + the stop budget's overrun, + the interpreter's exit (a process
        # start-up and teardown: seconds on a loaded 2-core machine; the stop itself is
        # bounded tighter in-process above). Not hung: a hung stop would take the 60 s.
        assert took < 5 + MAX_OVERRUN + 20, (took, err[-2000:])
        assert broker.counts(q).total == 10
        assert broker.counts(f"{q}.dlq").total == 0
