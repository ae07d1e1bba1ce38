"""A graceful stop, phase by phase: the one order both runtimes walk (no I/O).

`App` (threads over pika) and `AsyncApp` (tasks over aio-pika) stop in the same
order, written here once: `plan(live)` lists the phases, `steps` hands each its
share of the one `StopBudget` (`shutdown_timeout`) at the moment it begins, and
`walk` / `awalk` call the runtime's means for it (a `Stopper`: waiting on
threads and events, or awaiting). What each listener does in a phase is still
its core's decision (`ackkit._core.shutdown`); this module only says when.

The order, and why:

1. `HOLD`: each core holds (`Shutdown.hold`): no handler starts from now on and
   no retry runs again; what would have is kept, not returned yet. Then the
   in-process waits (retry delays, the rate limit) are cut short. First, so the
   stop is not spent on handlers that start while the broker answers the cancel
   (an AsyncApp whose cancel-ok came late ran ten more 0.2 s handlers, and their
   acks went down with the channel the timed-out cancel closed).
2. `CANCEL`: basic.cancel for every consumer, and its cancel-ok awaited. Before
   anything goes back: a copy published to the queue while the consumer still
   consumes could be delivered straight back to it. Once the cancel-ok is in,
   every delivery the broker sent before it is here.
3. `RETURN_UNSTARTED`: each core stops (`Shutdown.stop`: the acks held back go
   out, and what it kept goes back), and what waits for a handler (queued for a
   worker, a backlog, a partial batch, held by the flow gate) is handed to it:
   each goes back as a copy that keeps its attempt, its original acked once the
   copy is confirmed. Before the handlers finish, not after: those deliveries are
   not held up behind a slow handler, and their copies' confirms come in
   meanwhile.
4. `FINISH_HANDLERS`: running handlers get what is left of the budget. Past it
   `AsyncApp` cancels them and `App` leaves them to the broker (docs/how-it-works.md,
   "Deliveries returned unstarted"). Before anything an inbox handler needs goes:
   its transaction has its database connection to the end.
5. `SETTLE`: rounds until every core is quiescent (copies confirmed, the
   originals and the finished handlers' acks sent) or the share is over (its last
   `LAST_COPIES` seconds send no more copies, `give_back`; copies already sent get
   `COPY_GRACE` more, `may_close`). Each round first returns what is still
   unstarted (a delivery after a late cancel-ok, one a stopped worker left). What
   is not settled by the close the broker requeues, and a copy not confirmed by
   then may be in the queue next to its requeued original: so this share comes
   before the relay's, and has a floor.
6. `END_RELAY`: an outbox relay ends the batch it is sending (sent, confirmed,
   deleted). It publishes on the connection, so before the close; after the
   settle, because a batch cut short only stays in the database for the next app
   (the relay's share has no floor). `App`'s inbox ends its relay, probe and
   retention threads and then its database connections (`SyncInbox.close`).
7. `CLOSE`: the connection closes (close-ok awaited `CLOSE_GRACE`, then dropped)
   and the I/O thread or the main task ends.
8. `RELEASE`: what the runtime still holds: `AsyncApp`'s inbox database
   connections and thread pool, the observers' thread (every event emitted so far
   heard).

A connection that no longer serves (lost, or never opened) has no channel for
`CANCEL`, `RETURN_UNSTARTED` and `SETTLE`: the broker requeued everything its
channels had. `plan(False)` leaves those out; the rest keeps its order.
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Protocol, TypeVar

from .._core.outcome import EXIT_SIGNALS
from .._core.stop_budget import StopBudget
from .._telemetry.logs import log_stop


class Phase(enum.Enum):
    """One phase of a graceful stop (the module docstring says what each does); its
    value names the `Stopper` method that carries it out."""

    HOLD = "hold_starts"
    CANCEL = "cancel_consumers"
    RETURN_UNSTARTED = "return_unstarted"
    FINISH_HANDLERS = "finish_handlers"
    SETTLE = "settle"
    END_RELAY = "end_relay"
    CLOSE = "close_connection"
    RELEASE = "release"


ORDER: tuple[Phase, ...] = tuple(Phase)
"""Every phase, in the order a stop with a serving connection walks them."""
ON_THE_CHANNEL = frozenset({Phase.CANCEL, Phase.RETURN_UNSTARTED, Phase.SETTLE})
"""The phases only a connection that still serves can carry out."""


def plan(live: bool) -> tuple[Phase, ...]:
    """The phases of a stop, in order; `live`: the connection serves as it begins."""
    if live:
        return ORDER
    return tuple(p for p in ORDER if p not in ON_THE_CHANNEL)


@dataclass(frozen=True, slots=True)
class StopStep:
    """A phase as it begins: how long it may wait, out of the stop's budget."""

    phase: Phase
    wait: float
    """Seconds the phase may wait (0 for one that waits for nothing)."""
    told: float
    """The shutdown timeout the stop was given (for log lines)."""


_SHARES: dict[Phase, Callable[[StopBudget], float]] = {
    Phase.CANCEL: StopBudget.cancel,
    Phase.FINISH_HANDLERS: StopBudget.handlers,
    Phase.SETTLE: StopBudget.confirms,
    Phase.END_RELAY: StopBudget.relay,
    Phase.CLOSE: lambda budget: budget.close,
}
"""The phases that wait, and which of the budget's shares each one gets."""


def share(phase: Phase, budget: StopBudget) -> float:
    """`phase`'s wait, asked of `budget` as the phase begins (0: it waits for nothing)."""
    ask = _SHARES.get(phase)
    return 0.0 if ask is None else ask(budget)


def steps(live: bool, budget: StopBudget, told: float) -> Iterator[StopStep]:
    """The stop's steps, each one's wait taken from `budget` only when it begins (what
    the phases before it took is no longer there)."""
    for phase in plan(live):
        yield StopStep(phase, share(phase, budget), told)


R_co = TypeVar("R_co", covariant=True)


class Stopper(Protocol[R_co]):
    """A runtime's means for each phase: `Stopper[None]` (App, on the caller's thread)
    or `Stopper[Awaitable[None]]` (AsyncApp, on its event loop)."""

    def hold_starts(self, due: StopStep) -> R_co:
        """`Shutdown.hold()` for every core, then cut the in-process waits short."""
        ...

    def cancel_consumers(self, due: StopStep) -> R_co:
        """Send basic.cancel for every consumer; wait for cancel-ok up to `due.wait`."""
        ...

    def return_unstarted(self, due: StopStep) -> R_co:
        """`Shutdown.stop()` for every core (its actions carried out); hand the core what
        waits for a handler: it returns them."""
        ...

    def finish_handlers(self, due: StopStep) -> R_co:
        """Wait up to `due.wait` for running handlers; then the runtime's way with late ones."""
        ...

    def settle(self, due: StopStep) -> R_co:
        """Settle rounds until every core is quiescent or `may_close` (`due.wait`)."""
        ...

    def end_relay(self, due: StopStep) -> R_co:
        """Let each outbox relay end its batch within `due.wait`."""
        ...

    def close_connection(self, due: StopStep) -> R_co:
        """Close the connection (close-ok awaited `due.wait`); end the I/O loop."""
        ...

    def release(self, due: StopStep) -> R_co:
        """Close what the runtime still holds (inbox connections, pools, observers)."""
        ...


def carry_out(stopper: Stopper[R_co], due: StopStep) -> R_co:
    """Call `stopper`'s means for `due`'s phase (the `Stopper` method its value names)."""
    means: Callable[[StopStep], R_co] = getattr(stopper, due.phase.value)
    return means(due)


def walk(stopper: Stopper[None], live: bool, budget: StopBudget, told: float) -> None:
    """Stop: every phase of `plan(live)` in order, each given its share as it begins."""
    for due in steps(live, budget, told):
        carry_out(stopper, due)


async def awalk(
    stopper: Stopper[Awaitable[None]], live: bool, budget: StopBudget, told: float
) -> None:
    """`walk`, awaiting each phase (AsyncApp)."""
    for due in steps(live, budget, told):
        await carry_out(stopper, due)


class Failing(Protocol):
    """A runtime that records the error it stops for."""

    fatal: BaseException | None


def failed(rt: Failing, exc: BaseException, what: str) -> None:
    """Something that must not go on quietly: a failure of ackkit's own threads or
    tasks, or a handler that raised an interpreter-exit signal. `exc` becomes the
    runtime's fatal error (the first one stays), and the ERROR line says why the app
    stops; the runtime then stops (its deliveries settled or left to the broker to
    requeue), `run()` raises `exc` and `is_running` turns False: never a listener
    that looks alive and consumes nothing."""
    if rt.fatal is None:
        rt.fatal = exc
    log_stop(what, exc, EXIT_SIGNALS)
