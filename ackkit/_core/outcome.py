"""What one handler invocation comes to: the core's single answer to "it returned / it raised".

A runtime runs a handler (for one delivery, or a batch) and hands whatever
happened to `handled()`: the return value, or the exception, whatever its
type. The answer is a `Step`: channel actions to carry out now, in
order; deliveries to run again after `delay` seconds (in-process retry, `run`); and,
when the handler raised an interpreter-exit signal, the exception the app must
stop with once those actions are carried out (`stop`). The attempt loop
(`ackkit._interpreter.attempts`) is then the same few lines for every runtime
(tenacity's `iter()` is the model): call, ask, do, maybe sleep and call again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from .actions import Action
from .errors import RequeueMessage
from .fates import Fates
from .policy import AckMode
from .step import Step
from .tracked import Tracked


class Stopper(Protocol):
    """What `handled` needs of the core's shutdown (`shutdown.Shutdown`; a protocol, as
    `shutdown` imports this module)."""

    @property
    def stopping(self) -> bool: ...

    def release(self, t: Tracked) -> list[Action]: ...


EXIT_SIGNALS: tuple[type[BaseException], ...] = (SystemExit, KeyboardInterrupt)
"""Raised by a handler, these settle its deliveries (requeued, not counted as failures)
and then stop the app with the same exception: the process was asked to end."""


@dataclass(frozen=True, slots=True)
class AckIndex:
    """Partial success of a batch handler (RocketMQ's ackIndex).

    Deliveries [0 .. index] succeeded and are acked; the rest are retried
    (within the listener's max attempts) or dead-lettered. index -1: none succeeded.
    """

    index: int


@dataclass(frozen=True, slots=True)
class Interruption:
    """What a runtime knows of a cancellation that reached a running handler (asyncio's
    CancelledError): facts only; `released` decides what it comes to."""

    ours: bool
    """ackkit cancelled the handler's task itself (a handler past the shutdown timeout,
    the runtime's own tasks at stop), or the handler runs in no task at all."""
    asked: bool | None
    """Someone asked the task to cancel (asyncio's Task.cancelling() > 0, or a task the
    runtime cannot ask); None: this Python cannot tell (3.10)."""
    stopping: bool
    """The app is stopping."""


def released(i: Interruption) -> bool:
    """Is an interrupted handler call released (its deliveries go back to their queue,
    the call counted as an attempt, never retried or dead-lettered), or a failure like
    any other? Released when the cancellation came from outside the handler: ackkit's
    own, asked of its task, or (with no way to tell) while the app stops. A
    CancelledError the handler raised itself (or got from something it awaited) while
    nobody cancelled its task is a failure: released, it would come straight back, for
    ever with max_attempts=1."""
    return i.ours or i.stopping or i.asked is True


def succeeded(result: object, size: int, batch: bool) -> int:
    """How many of `size` deliveries a handler that returned `result` settled as done.

    A batch handler may return AckIndex(i): the first i+1 succeeded (clamped to the
    batch; anything that is not an int index counts as none). Any other return value
    means all of them.
    """
    if not batch or not isinstance(result, AckIndex):
        return size
    index = result.index
    if isinstance(index, bool) or not isinstance(index, int):
        return 0
    return max(-1, min(index, size - 1)) + 1


def handled(
    idle: Step,
    fates: Fates,
    shutdown: Stopper,
    batch: Sequence[Tracked],
    result: object = None,
    exc: BaseException | None = None,
    *,
    is_batch: bool = False,
    undecodable: Sequence[tuple[Tracked, BaseException]] = (),
    traceback: str | None = None,
) -> Step:
    """Decide what `batch` comes to after its handler returned `result` or raised `exc`
    (a step for the channel of `idle`'s generation; `idle` itself when there is nothing
    to do, the usual answer: no step is made for it).

    `undecodable`: deliveries of the same batch whose body could not be decoded (the
    handler never saw them); they fail with their own BadPayload.
    """
    if exc is None and not is_batch and not undecodable and len(batch) == 1:
        # The hot path: one delivery, its handler returned (usually an ack held for the
        # next multiple-ack frame, so nothing to send now).
        done = fates.finish(batch[0])
        return Step(idle.generation, done) if done else idle
    generation = idle.generation
    stop: BaseException | None = None
    acts: list[Action] = []
    if exc is None:
        acts.extend(fates.finish_batch(batch, succeeded(result, len(batch), is_batch)))
    elif isinstance(exc, EXIT_SIGNALS):
        stop = exc
        if fates.mode is AckMode.NONE:  # nothing to give back: the broker forgot them on send
            acts.extend(fates.finish_batch(batch, 0, exc, traceback))
        else:
            # Back to the queue, not a failure of the message. A redelivery counts as an
            # attempt as usual, so a message that makes its handler exit every time still
            # reaches max attempts and the DLQ.
            why = RequeueMessage(f"handler interrupted by {type(exc).__name__}")
            acts.extend(fates.finish_batch(batch, 0, why))
    else:
        acts.extend(fates.finish_batch(batch, 0, exc, traceback))
    for t, e in undecodable:
        acts.extend(fates.finish(t, e, None))
    rerun = tuple(t for t in batch if t.again is not None)
    if not rerun:
        return Step(generation, acts, stop=stop)
    delay = 0.0
    for t in rerun:
        assert t.again is not None
        delay = max(delay, t.again.delay)
        t.again = None
    rest = acts
    if shutdown.stopping:  # no retry waits out a shutdown: back to the queue instead
        for t in rerun:
            rest.extend(shutdown.release(t))
        return Step(generation, rest, stop=stop)
    return Step(generation, rest, rerun, delay, stop)
