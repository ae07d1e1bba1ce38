"""Taking a queue's head over AMQP 0-9-1, for the messages RabbitMQ cannot convert for
AMQP 1.0 (the rule, and why: `ackkit._core.conversion`).

- `SUSPECTS` remembers, across connections, which queues the next consumer takes
  messages of over AMQP 0-9-1 first, and how many: a channel adds its queues when the
  broker ended its connection that way, a consumer takes its queue's entry when it
  attaches.
- `take` gets them with basic.get on a short AMQP 0-9-1 connection, in a thread of its
  own, and hands them to the channel on its loop with the `Held` channel they are
  settled on (`Fetched` stands for one in the channel's unsettled deliveries).
"""

from __future__ import annotations

import contextlib
import copy
import logging
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger("ackkit")


class Suspects:
    """The queues whose next consumer takes messages over AMQP 0-9-1 first, and how
    many: kept across connections, by node and queue."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queues: dict[tuple[str, int, str, str], tuple[int, int]] = {}

    def add(self, params: Any, queue: str, n: int, delivered: int) -> None:
        """`n` to take, of which the first `delivered` were delivered before the end."""
        key = (params.host, params.port, params.virtual_host, queue)
        with self._lock:
            self._queues[key] = max((n, delivered), self._queues.get(key, (0, 0)))

    def take(self, params: Any, queue: str) -> tuple[int, int]:
        """(how many to take, how many of them were delivered), once; (0, 0) if none."""
        key = (params.host, params.port, params.virtual_host, queue)
        with self._lock:
            return self._queues.pop(key, (0, 0))


SUSPECTS = Suspects()


class Held:
    """The AMQP 0-9-1 channel holding deliveries that `take` got: closed (in a thread,
    off the loop) once each is settled, or by `close` when the consumer's channel goes,
    which gives back what is still unsettled."""

    def __init__(self, conn: Any, channel: Any, count: int) -> None:
        self.conn = conn
        self.channel = channel
        self.left = count

    def settle(self, tag: int, ack: bool, dead: bool) -> None:
        """Settle one: `ack`, else reject, requeued unless `dead` (to the queue's own
        dead-letter route)."""
        with contextlib.suppress(Exception):  # its connection gone: the broker gave it back
            if ack:
                self.channel.basic_ack(tag)
            else:
                self.channel.basic_reject(tag, requeue=not dead)
        self.left -= 1
        if self.left <= 0:
            self.close()

    def close(self) -> None:
        conn, self.conn = self.conn, None
        if conn is not None:
            threading.Thread(target=_close, args=(conn,), daemon=True).start()


class Fetched:
    """A delivery that `take` got, where the channel keeps a proton delivery."""

    __slots__ = ("held", "tag")

    def __init__(self, held: Held, tag: int) -> None:
        self.held = held
        self.tag = tag


Deliver = Callable[[list[tuple[Any, Any, bytes]], "Held | None"], None]


def take(conn: Any, queue: str, n: int, auto_ack: bool, deliver: Deliver) -> None:
    """Get up to `n` messages of `queue` over AMQP 0-9-1 (a connection to the node of
    `conn`, the AMQP 1.0 connection, opened in a thread) and call `deliver(got, held)`
    on `conn`'s loop: `got` the (basic.get-ok, properties, body) of each, in the queue's
    order; `held` the channel to settle them on (None with `auto_ack`, or none got)."""
    log.warning(
        "queue %r: taking up to %d message(s) over AMQP 0-9-1 before consuming over "
        "AMQP 1.0 again (the broker ended the last connection on a message it could "
        "not convert)",
        queue,
        n,
    )

    def work() -> None:
        got: list[tuple[Any, Any, bytes]] = []
        bc: Any = None
        ch: Any = None
        try:
            from .._sync._pika import blocking_connection

            params = copy.copy(conn.params)
            params.heartbeat = 0  # a handler may take its time before the settle
            bc = blocking_connection(params)
            ch = bc.channel()
            for _ in range(n):
                method, props, body = ch.basic_get(queue, auto_ack=auto_ack)
                if method is None:
                    break
                got.append((method, props, body))
        except Exception as exc:  # what was got is still handed over; the link consumes
            log.warning("queue %r: taking messages over AMQP 0-9-1 failed: %s", queue, exc)
        held = Held(bc, ch, len(got)) if bc is not None else None
        if held is not None and (auto_ack or not got):
            held.close()  # nothing to settle there
            held = None

        def done() -> None:
            deliver(got, held)

        try:
            conn.ioloop.add_callback_threadsafe(done)
        except RuntimeError:  # the loop is gone, and the AMQP 1.0 channel with it
            if held is not None:
                held.close()

    threading.Thread(target=work, name="ackkit-amqp10-091", daemon=True).start()


def _close(conn: Any) -> None:
    with contextlib.suppress(Exception):
        if conn.is_open:
            conn.close()
