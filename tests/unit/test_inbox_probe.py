"""The App's inbox probe and a second database-down: a down() that comes after the
probe resumed the listener, while its thread is still finishing, starts a probe of its
own. (It counted the finishing probe as alive and left the listener paused for ever,
its deliveries returned and no probe to resume it.) In-memory store, a real core."""

from __future__ import annotations

import queue
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

    def call_soon(fn: Any) -> bool:
        if threading.current_thread().name.endswith("dbprobe") and first[0]:
            first[0] = False
            held.set()
            release.wait(10)
        return True

    c: Any = SimpleNamespace(
        lock=threading.Lock(),
        core=core,
        rt=SimpleNamespace(call_soon=call_soon),
        inbox=queue.SimpleQueue(),
        spec=SimpleNamespace(name="l"),
        queue=lambda gen, acts: None,  # the outbox (the core's answer is decided, not sent)
        flush=lambda: None,
    )
    inbox = SyncInbox(Inbox("memory://probe-race"), c)

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
