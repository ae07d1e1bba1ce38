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

_ours: weakref.WeakSet[asyncio.Future[Any]] = weakref.WeakSet()

_task_cancelling: Callable[[asyncio.Task[Any]], int] | None = getattr(
    asyncio.Task, "cancelling", None
)
"""Task.cancelling (Python 3.11+), or None (3.10; tests hide it to run as 3.10 does)."""


def cancel(task: asyncio.Future[Any]) -> None:
    """Cancel `task` and record that ackkit did."""
    _ours.add(task)
    task.cancel()


def cancelled_from_outside(task: asyncio.Task[Any] | None, stopping: bool = False) -> bool:
    """Was `task` (the running handler task, when a CancelledError reached it) asked to
    cancel: by ackkit (recorded by `cancel`), by anyone (Task.cancelling(), 3.11+), or,
    with no way to tell (3.10), while the runtime is `stopping`? False: the handler's
    own CancelledError."""
    if task is None or task in _ours or stopping:
        return True
    how = _task_cancelling
    if how is None:
        return False
    try:
        return how(task) > 0
    except TypeError:  # not an asyncio.Task (a custom task factory's future)
        return True
