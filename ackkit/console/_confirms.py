"""Publish a window of replay copies at once and learn which ones the broker confirmed.

pika's BlockingChannel waits for each confirm before the next publish (one round
trip, and on a durable queue one disk write, per copy: tens per second on a busy
machine). This publisher sends a window of copies with `mandatory` on a channel in
confirm mode and waits for all their confirms together. The console acks a dead
letter only for a copy that was confirmed and not returned.

A returned copy (no queue to route it to) is matched to what was published by its
routing key, message id and body: every copy of the window that looks the same is
taken as returned (at worst a dead letter stays in the DLQ that could have gone; never
one acked whose copy was not routed).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pika.spec

WINDOW = 500
"""Copies published before waiting for their confirms."""


@dataclass
class Copy:
    target: str
    body: bytes
    properties: Any
    message_id: str | None


class ConfirmedPublisher:
    """Publishes on its own channel of `conn` (a BlockingConnection), on that thread."""

    def __init__(self, conn: Any, timeout: float = 60.0) -> None:
        self._conn = conn
        self._timeout = timeout
        self._ch: Any = None
        self._seq = 0
        self._acked: set[int] = set()
        self._nacked: set[int] = set()
        self._returned: list[tuple[str, str | None, bytes]] = []
        self._selected = False
        self._pending: set[int] = set()

    def _channel(self) -> Any:
        if self._ch is not None and self._ch.is_open:
            return self._ch
        self._ch = self._conn.channel()
        self._seq = 0
        self._selected = False
        impl = self._ch._impl  # the async channel: confirms arrive as callbacks, unwaited
        impl.add_on_return_callback(self._on_return)
        impl.confirm_delivery(ack_nack_callback=self._on_confirm, callback=self._on_select)
        self._wait(lambda: self._selected, "confirm.select")
        return self._ch

    def _on_select(self, _frame: Any) -> None:
        self._selected = True

    def _on_return(self, _ch: Any, method: Any, props: Any, body: bytes) -> None:
        self._returned.append((method.routing_key, getattr(props, "message_id", None), body))

    def _on_confirm(self, frame: Any) -> None:
        m = frame.method
        into = self._acked if isinstance(m, pika.spec.Basic.Ack) else self._nacked
        if m.multiple:
            into.update(s for s in self._pending if s <= m.delivery_tag)
        else:
            into.add(m.delivery_tag)

    def _wait(self, done: Any, what: str) -> None:
        deadline = time.monotonic() + self._timeout
        while not done():
            if self._ch is None or not self._ch.is_open:
                raise ConnectionError(f"the publishing channel closed while waiting for {what}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"no {what} from the broker within {self._timeout:g} s")
            self._conn.process_data_events(time_limit=0.01)

    def publish(self, copies: Sequence[Copy]) -> list[str | None]:
        """Publish `copies`; for each, None when the broker confirmed it and did not return
        it, else why it is not known to be routed."""
        out: list[str | None] = ["not published"] * len(copies)
        seqs: dict[int, int] = {}
        try:
            ch = self._channel()
            self._acked, self._nacked, self._returned = set(), set(), []
            for i, c in enumerate(copies):
                ch._impl.basic_publish("", c.target, c.body, c.properties, mandatory=True)
                self._seq += 1
                seqs[self._seq] = i
            self._pending = set(seqs)
            self._wait(lambda: self._pending <= self._acked | self._nacked, "publisher confirms")
        except Exception as exc:  # none is acked: at worst a copy and its dead letter stay
            return [f"{type(exc).__name__}: {exc}"[:300]] * len(copies)
        finally:
            self._pending = set()
        returned = set(self._returned)
        for s, i in seqs.items():
            c = copies[i]
            if s in self._nacked:
                out[i] = "NackError (the broker refused the copy)"
            elif (c.target, c.message_id, c.body) in returned:
                out[i] = "UnroutableError (no such queue?)"
            else:
                out[i] = None
        return out

    def close(self) -> None:
        if self._ch is not None and self._ch.is_open:
            self._ch.close()
        self._ch = None
