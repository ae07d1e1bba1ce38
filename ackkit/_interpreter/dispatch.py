"""The one dispatch of a step: each action the core decided, as the channel operation
a runtime performs, in the order decided.

A runtime's channel side (the App's executor on pika's I/O thread, the AsyncApp's settler
on the event loop, the pull connections, the Spark source's consumer) asks one question
of a step, in one place: is the channel of its generation still the listener's channel,
open (`Step.generation`)? If not, the step is dropped (`stale`): a delivery tag is
channel-scoped, and a stale one closes the new channel with PRECONDITION_FAILED. If so,
it walks `operations(step, originals)` and performs each with its client:

- `SETTLE` (an Ack, Nack or Reject): the basic.ack / basic.nack / basic.reject frame;
- `PUBLISH` (a Republish): the copy goes to the runtime's confirm publisher;
- `TX_SELECT`, `TX_COMMIT`: tx.select, tx.commit;
- `FENCE` (the rest of the step): a no-op round trip (basic.qos with the listener's
  prefetch), then the rest, a step of its own, once the broker answered (the walk
  ends at a fence);
- `CONSUME` (on or off): basic.consume, or basic.cancel;
- `START` (a held delivery), `RUN` (one the flow gate let through): the runtime's
  object for the delivery goes to a handler.

What the dispatch does itself, the same for every runtime: it turns tags back into the
runtime's objects (`Originals`), skips a `Start` or `Run` whose delivery is no longer
known, and marks a tag done once its settle frame went out (a multiple frame: every tag
up to it). A runtime whose send raises (the channel closed under it) stops walking: what
was not sent is not marked.
"""

from __future__ import annotations

from collections.abc import Iterator
from enum import Enum
from typing import Any, TypeVar

from .._core.actions import Ack, Consume, Fence, Nack, Reject, Republish, Run, Start, TxCommit
from .._core.actions import TxSelect as _TxSelect
from .._core.step import Step
from .originals import Originals

T = TypeVar("T")


class Op(Enum):
    """What a runtime does on its channel for one action."""

    SETTLE = "settle"
    PUBLISH = "publish"
    TX_SELECT = "tx.select"
    TX_COMMIT = "tx.commit"
    FENCE = "fence"
    CONSUME = "consume"
    START = "start"
    RUN = "run"


SETTLE, PUBLISH, TX_SELECT, TX_COMMIT = Op.SETTLE, Op.PUBLISH, Op.TX_SELECT, Op.TX_COMMIT
FENCE, CONSUME, START, RUN = Op.FENCE, Op.CONSUME, Op.START, Op.RUN


def operations(step: Step, originals: Originals[Any]) -> Iterator[tuple[int, Op, Any]]:
    """`step`'s actions as (index, operation, argument) in order: the argument is the
    action itself for SETTLE and PUBLISH, `on` for CONSUME, the runtime's object for
    START and RUN, the rest of the step for FENCE (the last one yielded), None else."""
    gen = step.generation
    acts = step.actions
    for i, a in enumerate(acts):
        ta = type(a)
        if ta is Ack or ta is Nack or ta is Reject:
            yield i, SETTLE, a
            originals.settled(gen, a)  # type: ignore[arg-type]  # its frame went out
        elif ta is Republish:
            yield i, PUBLISH, a
        elif ta is Run:
            ready = originals.get(gen, a.tag)  # type: ignore[union-attr]
            if ready is not None:
                yield i, RUN, ready
        elif ta is Start:
            held = originals.get(gen, a.tag)  # type: ignore[union-attr]
            if held is not None:
                yield i, START, held
        elif ta is Consume:
            yield i, CONSUME, a.on  # type: ignore[union-attr]
        elif ta is Fence:
            yield i, FENCE, Step(gen, acts[i + 1 :])
            return
        elif ta is TxCommit:
            yield i, TX_COMMIT, None
        elif ta is _TxSelect:
            yield i, TX_SELECT, None


def stale(step: Step, originals: Originals[T]) -> tuple[list[T], list[int]]:
    """`step` was decided for a channel that is gone: nothing of it goes out. Returns the
    runtime's objects of its `Run`s (they still go to a handler, whose `begin` finds them
    stale and frees the serial keys they hold) and the tokens of its copies (never sent,
    never answered: the runtime forgets their originals)."""
    gen = step.generation
    runs: list[T] = []
    tokens: list[int] = []
    for a in step.actions:
        if type(a) is Run:
            d = originals.get(gen, a.tag)
            if d is not None:
                runs.append(d)
        elif type(a) is Republish:
            tokens.append(a.token)
    return runs, tokens


def settles(step: Step) -> bool:
    """Does `step` carry anything but copies (worth a log line when it is dropped)?"""
    return any(type(a) is not Republish for a in step.actions)
