"""The App consumer: carrying out what the core decides about a refused or cancelled
consumer.

The broker refuses a basic.consume by closing the channel, and may cancel a
consumer it had accepted (basic.cancel: a deleted queue, RabbitMQ 4.3's
consumer timeout). `ackkit._core.consume.Consuming` and
`ListenerCore.consumer_cancelled` decide what that comes to; this module only
does it on pika's I/O thread: a new channel after a pause, a declare of the
deleted queue first, a quiet standby, or `fail()`.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Protocol, Self

from .._interpreter.refusals import carry_out
from .._telemetry.logs import log_cancel
from .host import OnChannel

if TYPE_CHECKING:
    from .._app.listener_spec import ListenerSpec
    from .._core.consume import Consuming
    from .host import Host

log = logging.getLogger("ackkit")


class RefusedConsumer(OnChannel, Protocol):
    """What this module uses of the App consumer (`consumer.Consumer`)."""

    @property
    def rt(self) -> Host[Self]: ...
    @property
    def spec(self) -> ListenerSpec: ...
    @property
    def consuming(self) -> Consuming: ...

    def _reopen(self, conn: Any) -> None: ...


def refused(c: RefusedConsumer, conn: Any, code: int, text: str) -> None:
    """The broker refused the basic.consume: carry out what the core decides."""

    def reopen(delay: float, standby: bool) -> None:
        if standby:
            c.rt.consumer_ready(c)  # started: standing by is a state, not a failure
        else:
            log.error("%s: channel closed by broker: (%d, %r)", c.spec.name, code, text)
        conn.ioloop.call_later(delay, lambda: c._reopen(conn))

    step = c.consuming.refused(code, text)
    carry_out(step, c.spec.name, fail=c.rt.fail, redeclare=lambda: c.rt.redeclare(c), reopen=reopen)


def cancelled_by_broker(c: RefusedConsumer, ch: Any, frame: Any) -> None:
    """basic.cancel from the broker (RabbitMQ 4.3's consumer timeout, a deleted queue):
    the core fences the consumer's deliveries; a new channel consumes again."""
    if ch is not c.channel or c.rt.stopping:
        return
    with c.lock:
        outstanding = c.core.consumer_cancelled()
    log_cancel(log, c.spec.name, outstanding)
    c.consumer_tag = None
    if ch.is_open:
        ch.close()  # -> Consumer._on_channel_closed: a new channel after the usual pause
