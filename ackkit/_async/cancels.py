"""The cancellations ackkit makes itself, so that a handler's own CancelledError is not
taken for one.

A handler task ackkit cancels (a handler still running past the shutdown timeout,
the runtime's own tasks at stop) is released: its delivery goes back to its queue,
never retried or dead-lettered. A CancelledError the handler raises itself (or gets
from something it awaited that was cancelled), while nobody cancelled its task, is a
failure like any other: released, it would come straight back, for ever.

Telling the two apart: ackkit records every task it cancels (`cancel`); on Python
3.11+ `Task.cancelling()` also says whether someone else (asyncio.run's teardown,
a caller's `task.cancel()`) asked the task to cancel. Python 3.10 has no
`Task.cancelling()`: there, only ackkit's own cancellations are known (and a
runtime that is stopping takes every cancellation for its own).
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable
from typing import Any

from .._core.outcome import Interruption, released

_ours: weakref.WeakSet[asyncio.Future[Any]] = weakref.WeakSet()

_task_cancelling: Callable[[asyncio.Task[Any]], int] | None = getattr(
    asyncio.Task, "cancelling", None
)
"""Task.cancelling (Python 3.11+), or None (3.10; tests hide it to run as 3.10 does)."""


def cancel(task: asyncio.Future[Any]) -> None:
    """Cancel `task` and record that ackkit did."""
    _ours.add(task)
    task.cancel()


def interruption(task: asyncio.Task[Any] | None, stopping: bool = False) -> Interruption:
    """What is known of the cancellation that reached `task` (the running handler task):
    did ackkit cancel it (recorded by `cancel`), did anyone ask it to (Task.cancelling(),
    3.11+; unknown on 3.10), is the runtime `stopping`? The core decides what that comes
    to (`Shutdown.interrupted`)."""
    ours = task is None or task in _ours
    how = _task_cancelling
    asked: bool | None = None
    if how is not None and task is not None and not ours:
        try:
            asked = how(task) > 0
        except TypeError:  # not an asyncio.Task (a custom task factory's future)
            asked = True
    return Interruption(ours, asked, stopping)


def cancelled_from_outside(task: asyncio.Task[Any] | None, stopping: bool = False) -> bool:
    """Is the cancellation that reached `task` released (not the handler's own
    CancelledError)? The core's rule (`outcome.released`) on `interruption`'s facts."""
    return released(interruption(task, stopping))
