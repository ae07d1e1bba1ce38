"""The attempt loop: one unit of deliveries (one, or a batch) from "a worker took it"
to "the core is done with it", written once for every runtime.

`attempts()` is a generator that does no I/O and never waits. It yields requests, and
a driver (the App's worker thread, the AsyncApp's task) carries each out with its own
means and sends back the answer, as tenacity's `Retrying.iter()` hands out "call",
"sleep" or "return":

- `Ask((fn, args))`: ask the core (`begin`, `handled`, `resume`, a release); the answer
  is a `Step` (true when it has actions). The driver asks under the listener's lock
  where there is one, and hands
  the actions to its channel side in the same breath (decision order is frame order);
  the answer goes back to the loop.
- `Call((inv,))`: run the handler for the invocation (through the inbox's transaction when
  the listener has one); the answer is a `Called`.
- `Pause(seconds)`: wait, cut short when the app stops (a rate limit, an in-process
  retry's delay). No answer.
- `LookUp(delivery)`: an inbox listener, a redelivery the core would charge: is its
  key recorded already? The answer is the recorded key, None, or the DatabaseDown that
  kept the inbox from saying.
- `Down(inv, exc)`: the inbox's database is down: return the deliveries unstarted
  and pause the listener (the inbox runner does both). No answer.
- `Failed(inv, exc)`: the handler failed: log it (before the core moves the attempt on).
- `Stop(exc)`: the handler raised an interpreter-exit signal: stop the app with it.

A driver that is interrupted while it carries out a request (asyncio's cancellation of
a handler's task) throws `Interrupted` into the loop, which gives the deliveries back to
the core (released, never retried or dead-lettered) and raises it again; so does a
handler call the core calls released (`Called.interruption`). The driver then raises
its own cancellation.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import Any

from .._app.handler import Binding
from .._app.invocation import HandlerProbe, Invocation
from .._core.actions import Action
from .._core.inbox import DatabaseDown
from .._core.listener import ListenerCore, Tracked
from .._core.outcome import Interruption
from .._core.step import Step
from .._messages.delivery import DeliveryBase
from ..inbox._run import duplicate


class Ask(tuple[Callable[..., Any], tuple[Any, ...]]):
    """Ask the core `fn(*args)`; carry out the answer's `actions` at once, in order.
    Made as `Ask((fn, args))`: a tuple, so a request costs no Python call."""

    __slots__ = ()
    fn = property(itemgetter(0))
    args = property(itemgetter(1))


class Call(tuple[Invocation]):
    """Run the handler for `inv`; answer with a `Called`. Made as `Call((inv,))`."""

    __slots__ = ()
    inv = property(itemgetter(0))


@dataclass(slots=True)
class Called:
    """What a handler call came to, as the driver saw it."""

    result: object = None
    exc: BaseException | None = None
    traceback: str | None = None
    """The formatted traceback where the driver has it (else the core formats it)."""
    interruption: Interruption | None = None
    """A cancellation reached the call (asyncio): what is known of it."""


RETURNED = Called()
"""A handler that returned None (shared: nobody writes to it)."""


@dataclass(slots=True)
class Pause:
    """Wait `seconds`, cut short when the app stops."""

    seconds: float


@dataclass(slots=True)
class LookUp:
    """Is this redelivery's inbox key recorded? Answer: the key, None, or a DatabaseDown."""

    delivery: DeliveryBase


@dataclass(slots=True)
class Down:
    """The inbox's database is down: `inv`'s deliveries go back unstarted, the listener
    pauses until it answers."""

    inv: Invocation
    exc: BaseException


@dataclass(slots=True)
class Failed:
    """The handler for `inv` failed with `exc`: log it."""

    inv: Invocation
    exc: BaseException


@dataclass(slots=True)
class Stop:
    """Stop the app with `exc` (a handler raised SystemExit or KeyboardInterrupt)."""

    exc: BaseException


Request = Ask | Call | Pause | LookUp | Down | Failed | Stop
"""What the attempt loop asks its driver to do."""


class Interrupted(Exception):
    """Thrown into the attempt loop by a driver whose wait was cancelled, and raised out
    of it once the deliveries are released."""


Loop = Generator[Request, Any, None]
"""`attempts()`: requests out, answers in; ends when the core is done with the unit."""


def attempts(
    core: ListenerCore,
    binding: Binding,
    ds: Sequence[DeliveryBase],
    *,
    inbox: bool = False,
    probe: HandlerProbe | None = None,
) -> Loop:
    """The attempt loop for `ds` (one delivery, or a batch) of the listener whose core is
    `core` and whose handler is `binding` (`inbox`: it runs in the inbox's transaction;
    `probe`: metrics and tracing, when on)."""
    if inbox:  # a redelivery whose key is recorded: a duplicate, finished apart
        ds = yield from _duplicates_apart(core, binding, ds)
        if not ds:
            return
    # may they start? (not once stopping, not after their channel closed, the flow gate)
    ts = [ds[0]._tracked] if len(ds) == 1 else [d._tracked for d in ds]
    go = yield Ask((core.begin, (ts,)))
    while go.delay > 0:  # the rate limit's
        yield Pause(go.delay)
        go = yield Ask((_begin_again, (core, go.run)))
    if not go.run:
        return
    if len(go.run) < len(ds):
        ds = [d for d in ds if d._tracked in go.run]
    inv = Invocation(binding, ds)
    try:
        out = yield from _attempt(core, inv, inbox, probe)
        while out.run:
            yield Pause(out.delay)  # the app's stop cuts the wait short
            out = yield Ask((core.resume, (out.run,)))
            if not out.run:
                return
            inv = inv.again(out.run)
            out = yield from _attempt(core, inv, inbox, probe)
    except Interrupted:  # shutdown or a lost channel: requeued, not a failure
        yield Ask((_release, (core, inv.deliveries, True)))
        raise


def _duplicates_apart(
    core: ListenerCore, binding: Binding, ds: Sequence[DeliveryBase]
) -> Generator[Request, Any, list[DeliveryBase]]:
    """The deliveries of `ds` that are not known duplicates. A redelivery the core would
    charge or dead-letter is looked up first (`LostRuns.look_up_first`): a recorded key
    finishes it as a duplicate; a database that is down returns it unstarted."""
    keep: list[DeliveryBase] = []
    try:
        for d in ds:
            if not (yield Ask((_look_up_first, (core, d)))).yes:
                keep.append(d)
                continue
            found = yield LookUp(d)
            if found is None:
                keep.append(d)
            elif isinstance(found, DatabaseDown):
                yield Down(Invocation(binding, [d]), found)
            else:
                yield Ask((_duplicate, (core, binding, d, found)))
    except Interrupted:  # never started: back to the queue
        yield Ask((_release, (core, [*keep, *ds[len(keep) :]], False)))
        raise
    return keep


def _attempt(
    core: ListenerCore, inv: Invocation, inbox: bool, probe: HandlerProbe | None
) -> Generator[Request, Any, Step]:
    """Call the handler once; what the core makes of it is carried out."""
    ds = inv.deliveries
    done = probe(ds) if probe is not None and ds else None
    called: Called = yield Call((inv,))
    exc = called.exc
    if called.interruption is not None and core.shutdown.interrupted(called.interruption):
        if done is not None:
            done(exc)
        raise Interrupted  # released by `attempts`
    if exc is None:
        if done is not None:
            done(None)
        ok: Step = yield Ask((inv.outcome, (core, called.result, None, None)))
        return ok
    if inbox and isinstance(exc, DatabaseDown):
        if done is not None:
            done(exc)
        yield Down(inv, exc)  # returned unstarted, the listener paused
        return _NOTHING
    yield Failed(inv, exc)  # before the core moves the attempt on
    if done is not None:
        done(exc)
    out: Step = yield Ask((inv.outcome, (core, called.result, exc, called.traceback)))
    if out.stop is not None:
        yield Stop(out.stop)
    return out


_NOTHING = Step(0)
"""Nothing to carry out, nothing to run (after the inbox returned the deliveries)."""


class _Answer:
    """Whether to look a key up first (`yes`): an answer with nothing to carry out (false,
    as a Step without actions is)."""

    __slots__ = ("actions", "yes")

    def __init__(self, yes: bool) -> None:
        self.actions: list[Action] = []
        self.yes = yes

    def __bool__(self) -> bool:
        return False


_YES = _Answer(True)
_NO = _Answer(False)


def _look_up_first(core: ListenerCore, d: DeliveryBase) -> _Answer:
    """Should the inbox look `d`'s key up before it starts (`LostRuns.look_up_first`)?"""
    return _YES if core.lost.look_up_first(d._tracked) else _NO


def _begin_again(core: ListenerCore, run: Sequence[Tracked]) -> Step:
    """`begin` once more after the rate limit's wait (not booked twice)."""
    return core.begin(run, waited=True)


def _release(core: ListenerCore, ds: Sequence[DeliveryBase], started: bool) -> Step:
    return core.shutdown.release_all([d._tracked for d in ds], started=started)


def _duplicate(core: ListenerCore, binding: Binding, d: DeliveryBase, key: str) -> Step:
    """`d`'s key is recorded: counted and logged as a duplicate, then finished as a
    handler that returned (acked, its flow gate told)."""
    duplicate(core, core.policy.name, d, key)
    return Invocation(binding, [d]).outcome(core, None, None)
