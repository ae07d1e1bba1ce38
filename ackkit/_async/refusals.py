"""AsyncConsumer: carrying out what the core decides about a refused basic.consume.

The broker refuses a consumer by closing its channel (aiormq raises the
matching `ChannelClosed` from `basic_consume`, and completes the channel's
`closing` future with it, in either order). `ackkit._core.consume.Consuming`
decides what that comes to; this module only does it: a new channel after a
pause, a declare of the deleted queue first, a quiet standby, or `fail()`.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import aiormq.exceptions
from aiormq.abc import AbstractChannel, AbstractConnection

from .._connection.url import mask_text
from .._core.errors import TopologyConflict
from .._interpreter.refusals import carry_out
from ._amqp import CHANNEL_GONE

if TYPE_CHECKING:
    from .consumer import AsyncConsumer

log = logging.getLogger("ackkit")

_CODES: tuple[tuple[type[BaseException], int], ...] = (
    (aiormq.exceptions.ChannelAccessRefused, 403),
    (aiormq.exceptions.ChannelNotFoundEntity, 404),
    (aiormq.exceptions.ChannelLockedResource, 405),
    (aiormq.exceptions.ChannelPreconditionFailed, 406),
)


def refusal(exc: BaseException | None) -> tuple[int | None, str]:
    """The broker's reply code and text of a channel close aiormq raised (None: not a
    channel close the broker sent)."""
    if exc is None:
        return None, ""
    for cls, code in _CODES:
        if isinstance(exc, cls):
            return code, mask_text(str(exc.args[0]) if exc.args else "")
    if isinstance(exc, aiormq.exceptions.ChannelClosed) and len(exc.args) >= 2:
        code = exc.args[0]
        return (code if isinstance(code, int) else None), mask_text(str(exc.args[1]))
    return None, mask_text(repr(exc))


def refused(c: AsyncConsumer, ch: AbstractChannel, exc: BaseException | None) -> None:
    """The broker closed `ch` before it answered the listener's basic.consume. Called
    from `basic_consume`'s error and from the channel's close, whichever comes first;
    carried out once per channel."""
    if c.refused_on is ch:
        return
    c.refused_on = ch
    c.lost(exc)
    conn = c.rt.amqp
    if c.rt.stopping or conn is None or conn.is_closed:
        return
    code, text = refusal(exc)

    def reopen(delay: float, standby: bool) -> None:
        if not standby:
            log.error("%s: channel closed by the broker: (%s, %r)", c.spec.name, code, text)
        c.rt.spawn(c.reopen_later(conn, delay))

    step = c.consume_state.refused(code, text)
    carry_out(
        step,
        c.spec.name,
        fail=c.rt.fail,
        redeclare=lambda: c.rt.spawn(redeclare(c, conn)),
        reopen=reopen,
    )


async def redeclare(c: AsyncConsumer, conn: AbstractConnection) -> None:
    """Declare the listener's deleted queue again (with its dead-letter and delay queues
    and bindings), then consume on a new channel. A refused declare stops the app."""
    try:
        await c.rt.declare_for(conn, [c])
    except TopologyConflict as exc:
        c.rt.fail(exc, f"{c.spec.name}: declaring its deleted queue again failed")
        return
    except (TimeoutError, *CHANNEL_GONE) as exc:  # the next refusal is counted by the core
        log.warning("%s: declaring queue %r again failed: %r", c.spec.name, c.spec.queue, exc)
    await c.reopen_later(conn, 0.0)


def consume_ok(c: AsyncConsumer) -> None:
    """The broker answered basic.consume: the listener consumes (a standby ended)."""
    line = c.consume_state.consumed()
    if line:
        log.info("%s", line)
