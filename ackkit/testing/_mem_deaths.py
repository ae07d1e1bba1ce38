"""The in-memory broker's dead letters, expiry and queue length limits.

As RabbitMQ does them: `x-dead-letter-exchange` / `-routing-key` with `x-death` and
the `x-first-death-*` / `x-last-death-*` headers; a dead-letter cycle (a message about
to reach a queue it already died in, with no `rejected` death on the way) is dropped;
TTLs (`x-message-ttl`, per-message `expiration`) expire at the head of the queue;
`x-max-length` and `x-max-length-bytes` count ready messages only (bodies' bytes),
with `x-overflow` drop-head (the default: the oldest ready messages are dead-lettered,
reason maxlen), reject-publish (the publish is nacked) and reject-publish-dlx (nacked
and dead-lettered). A quorum queue's reject-publish follows rabbit_fifo: the publish
that takes it over its limit is accepted, and the ones after it are refused until it
is down to 80% of its limits.
"""

from __future__ import annotations

import time
from typing import Any

from .._core import wire
from ._mem_state import Message, Queue, broker_written, copy_message, python_headers
from ._mem_topology import Topology

REJECTING = ("reject-publish", "reject-publish-dlx")


def _limit(q: Queue, name: str) -> int | None:
    value = q.arg(name)
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    return None


def is_cycle(queue: str, deaths: list[Any]) -> bool:
    """RabbitMQ's dead-letter cycle rule: `queue` is among the message's deaths (most
    recent first) and no death up to and including that one was a rejection."""
    for d in deaths:
        if not isinstance(d, dict) or d.get("reason") == "rejected":
            return False
        if d.get("queue") == queue:
            return True
    return False


class Deaths(Topology):
    """Dead-lettering, expiry and length limits of one in-memory broker's queues."""

    def _dispatch(self, q: Queue) -> None:  # pragma: no cover - the Model's
        raise NotImplementedError

    # -- length limits ------------------------------------------------------------------

    def _size(self, q: Queue, msg: Message) -> int:
        """What `msg` counts toward x-max-length-bytes: its body; on a quorum queue from
        RabbitMQ 4.0 on its encoded properties too (`self.rules`)."""
        if q.quorum and self.rules.quorum_size_counts_properties:
            return len(msg.body) + len(msg.props)
        return len(msg.body)

    def _ready_bytes(self, q: Queue) -> int:
        return sum(self._size(q, m) for _, m in q.ready)

    def _refuses(self, q: Queue, msg: Message) -> bool:
        """Whether a reject-publish queue refuses `msg`: a classic queue when its ready
        messages or their bodies' bytes, with `msg` added, would be over a limit
        (reject-publish-dlx dead-letters what it refuses); a quorum queue while it is
        blocked (`_over_limit`)."""
        if q.arg("x-overflow") not in REJECTING:
            return False
        length, size = _limit(q, "x-max-length"), _limit(q, "x-max-length-bytes")
        if length is None and size is None:
            return False
        if q.quorum:
            return q.blocked
        full = (length is not None and len(q.ready) + 1 > length) or (
            size is not None and self._ready_bytes(q) + self._size(q, msg) > size
        )
        if full and q.arg("x-overflow") == "reject-publish-dlx":
            self._dead_letter(q, msg, "maxlen")
        return full

    def _over_limit(self, q: Queue) -> None:
        """After an enqueue: a quorum reject-publish queue over a limit blocks its
        publishers (rabbit_fifo accepts the publish that took it over)."""
        if q.quorum and q.arg("x-overflow") in REJECTING:
            length, size = _limit(q, "x-max-length"), _limit(q, "x-max-length-bytes")
            if (length is not None and len(q.ready) > length) or (
                size is not None and self._ready_bytes(q) > size
            ):
                q.blocked = True

    def _relax(self, q: Queue) -> None:
        """After its ready messages went down: a blocked quorum queue takes publishes
        again once they and their bytes are at most 80% of its limits (rabbit_fifo's
        soft limit)."""
        if not q.blocked:
            return
        length, size = _limit(q, "x-max-length"), _limit(q, "x-max-length-bytes")
        if (length is None or len(q.ready) <= int(length * 0.8)) and (
            size is None or self._ready_bytes(q) <= int(size * 0.8)
        ):
            q.blocked = False

    def _drop_head(self, q: Queue) -> None:
        """drop-head (the default overflow): dead-letter the oldest ready messages while
        the queue is over a limit."""
        if q.arg("x-overflow") in REJECTING:
            return
        length, size = _limit(q, "x-max-length"), _limit(q, "x-max-length-bytes")
        if length is None and size is None:
            return
        total = self._ready_bytes(q) if size is not None else 0
        while q.ready and (
            (length is not None and len(q.ready) > length) or (size is not None and total > size)
        ):
            _, head = q.ready.pop(0)
            total -= self._size(q, head)
            self._dead_letter(q, head, "maxlen")
        self._relax(q)

    # -- dead letters and expiry --------------------------------------------------------

    def _dead_letter(self, q: Queue, msg: Message, reason: str) -> None:
        dlx = q.arg("x-dead-letter-exchange")
        if dlx is None or dlx not in self.exchanges:
            return
        rk = q.arg("x-dead-letter-routing-key")
        props = msg.properties()
        headers: dict[str, Any] = dict(props.get("headers") or {})
        if msg.deaths is None:  # before 4.0: whatever x-death the message carries
            deaths = list(python_headers(msg).get("x-death") or [])
        else:  # 4.0+: only what this broker dead-lettered
            deaths = [dict(d) for d in msg.deaths]
            if not deaths:  # the publisher's death headers start nothing
                for k in [k for k in headers if k.startswith(("x-first-death", "x-last-death"))]:
                    del headers[k]
        now = int(time.time())
        entry = None
        for d in deaths:
            if isinstance(d, dict) and d.get("queue") == q.name and d.get("reason") == reason:
                entry = d
        if entry is not None:
            deaths.remove(entry)
            entry["count"] = int(entry.get("count", 1)) + 1
            entry["time"] = now
        else:
            entry = {
                "count": 1,
                "reason": reason,
                "queue": q.name,
                "time": now,
                "exchange": msg.exchange,
                "routing-keys": [msg.routing_key],
            }
            if props.get("expiration") is not None:
                entry["original-expiration"] = props["expiration"]
        headers["x-death"] = [entry, *deaths]
        headers.setdefault("x-first-death-reason", reason)
        headers.setdefault("x-first-death-queue", q.name)
        headers.setdefault("x-first-death-exchange", msg.exchange)
        headers["x-last-death-reason"] = reason
        headers["x-last-death-queue"] = q.name
        headers["x-last-death-exchange"] = msg.exchange
        headers.pop("x-delivery-count", None)
        headers.pop("x-acquired-count", None)
        props["headers"] = broker_written(headers)
        props.pop("expiration", None)
        copy = Message(msg.body, wire.encode_properties(props), dlx, rk or msg.routing_key)
        if msg.deaths is not None:
            copy.deaths = [dict(d) for d in headers["x-death"]]
        for target in self.route(dlx, copy.routing_key, headers):
            if reason != "rejected" and is_cycle(target.name, headers["x-death"]):
                continue  # RabbitMQ drops it (and logs "dead-letter cycle detected")
            self._enqueue(target, copy_message(copy))

    def _enqueue(self, q: Queue, msg: Message) -> bool:  # pragma: no cover - the Model's
        raise NotImplementedError

    def _expire(self, q: Queue) -> None:
        now = self.clock.now()
        while q.ready:
            _, head = q.ready[0]
            if head.expires_at is None or head.expires_at > now:
                return
            q.ready.pop(0)
            self._dead_letter(q, head, "expired")
            self._relax(q)
            self.changed.notify_all()

    def expire_due(self) -> float | None:
        """Expire what is due in every queue; the clock time of the next expiry, or None."""
        with self.lock:
            nxt: float | None = None
            for q in list(self.queues.values()):
                self._dispatch(q)
                if q.ready and q.ready[0][1].expires_at is not None:
                    at = q.ready[0][1].expires_at
                    nxt = at if nxt is None else min(nxt, at)
            return nxt
