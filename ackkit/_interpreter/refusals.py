"""Carrying out what the core decided about a refused basic.consume, for any client.

`ackkit._core.consume.Consuming.refused` answers a refusal with a `ConsumeStep`: fail
the app, declare the deleted queue again, stand by, or retry after a pause. `carry_out`
logs the step's line and picks the move; the runtime says how each move is made with
its client (a thread's timer or a task, a blocking or an awaited declare).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from .._core.consume import ConsumeMove, ConsumeStep

log = logging.getLogger("ackkit")


def carry_out(
    step: ConsumeStep,
    listener: str,
    *,
    fail: Callable[[BaseException, str], None],
    redeclare: Callable[[], object],
    reopen: Callable[[float, bool], None],
) -> None:
    """Carry out `step` for `listener`: `fail(error, why)` stops the app,
    `redeclare()` declares the queue again and consumes on a new channel,
    `reopen(delay, standby)` consumes on a new channel after `delay` seconds (`standby`:
    another consumer holds the queue, the listener counts as started; else a plain
    retry)."""
    if step.log:
        log.warning("%s", step.log)
    if step.move is ConsumeMove.FAIL:
        assert step.error is not None
        fail(step.error, f"{listener}: cannot consume")
    elif step.move is ConsumeMove.DECLARE:
        redeclare()
    else:
        reopen(step.delay, step.move is ConsumeMove.STANDBY)
