"""The App's inbox probe and a second database-down: a down() that comes after the
probe resumed the listener, while its thread is still finishing, starts a probe of its
own. (It counted the finishing probe as alive and left the listener paused for ever,
its deliveries returned and no probe to resume it.) In-memory store, a real core, the
inbox's host (`ackkit.inbox._host.SyncHost`) played by the test."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace
from typing import Any

from ackkit._core.listener import ListenerCore
from ackkit._core.policy import ListenerPolicy
from ackkit.inbox import Inbox
from ackkit.inbox._run import DatabaseDown
from ackkit.inbox._sync import SyncInbox


def test_a_down_after_the_probe_resumed_starts_a_probe_of_its_own() -> None:
    core = ListenerCore(ListenerPolicy(name="l", queue="q"))
    core.channel_opened()
    held = threading.Event()  # the first probe, resumed, holds waking the I/O thread
    release = threading.Event()
    first = [True]

    def call_soon() -> None:
        if threading.current_thread().name.endswith("dbprobe") and first[0]:
            first[0] = False
            held.set()
            release.wait(10)

    lock = threading.Lock()

    def decide(fn: Any) -> None:  # the core's answer is decided, not sent
        with lock:
            step = fn(core)
        if step:
            call_soon()  # the I/O thread is woken to send it

    host: Any = SimpleNamespace(name="l", decide=decide, wait=threading.Event().wait)
    inbox = SyncInbox(Inbox("memory://probe-race"), host)

    def down(tag: int) -> None:
        t = core.receive(tag, message_id=f"m{tag}")
        inbox.down(SimpleNamespace(deliveries=[SimpleNamespace(_tracked=t)]), DatabaseDown("x"))

    try:
        down(1)
        assert core.gating.flow.paused
        assert held.wait(10)  # the probe pinged, resumed, and is still alive
        assert not core.gating.flow.paused
        down(2)  # the database went away again right after
        assert core.gating.flow.paused
        release.set()
        deadline = time.monotonic() + 10
        while core.gating.flow.paused and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not core.gating.flow.paused, "paused for ever: no probe after the second down()"
    finally:
        release.set()
        inbox.close()
