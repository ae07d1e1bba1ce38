"""Who hears a listener core's events, and on which thread.

A core emits its events while it decides, under the listener's lock, often on
the connection's I/O thread (a delivery arrived, a confirm came back). Only
ackkit's own log lines are written there (`LifecycleLog`: cheap, throttled).
The observers an application registers (`@app.on_event`) run on a thread of
their own (`ObserverThread`), in the order the events happened: a slow or
blocking observer delays nothing but later events, never an ack, a heartbeat
or another listener.
"""

from __future__ import annotations

import logging
import queue as _queue
import threading
from collections.abc import Sequence

from .._core.events import Event, Observer

log = logging.getLogger("ackkit")

CLOSE_TIMEOUT = 5.0
"""Seconds a stopping app waits for its observers to hear the events already emitted."""


class FanOut:
    """Calls every observer; `hot` when one of them wants RECEIVED and ACKED."""

    __slots__ = ("hot", "observers")

    def __init__(self, observers: Sequence[Observer]) -> None:
        self.observers = tuple(observers)
        self.hot = any(getattr(o, "hot", True) for o in self.observers)

    def __call__(self, ev: Event) -> None:
        for o in self.observers:
            try:
                o(ev)
            except Exception:
                log.exception("ackkit event observer failed")


class ObserverThread:
    """An observer that hands each event to a thread which calls `observers` in order."""

    __slots__ = ("_events", "_fan", "_thread", "hot")

    def __init__(self, observers: Sequence[Observer]) -> None:
        self._fan = FanOut(observers)
        self.hot = self._fan.hot
        self._events: _queue.SimpleQueue[Event | None] = _queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def __call__(self, ev: Event) -> None:
        self._events.put(ev)  # never blocks: the caller may hold a listener's lock

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="ackkit-events", daemon=True)
            self._thread.start()

    def close(self, timeout: float = CLOSE_TIMEOUT) -> None:
        """Let the observers hear what was emitted so far (up to `timeout`), then end."""
        th = self._thread
        if th is None:
            return
        self._events.put(None)
        th.join(timeout)
        if th.is_alive():
            log.warning("event observers still busy after %.0f s; not waited for", timeout)
        self._thread = None

    def _run(self) -> None:
        fan = self._fan
        while True:
            ev = self._events.get()
            if ev is None:
                return
            fan(ev)


def observing(
    own: Observer | None, registered: Sequence[Observer]
) -> tuple[Observer | None, ObserverThread | None]:
    """The observer for a runtime's cores: `own` (ackkit's log lines, called in place) and
    the `registered` ones behind an ObserverThread (the runtime starts and closes it)."""
    if not registered:
        return own, None
    events = ObserverThread(registered)
    return (events if own is None else FanOut([own, events])), events
