"""An AsyncConsumer's handler runs, and the release of deliveries no handler finished.

Whether a delivery may start, what a handler's result or exception means, when
an in-process retry runs again, and what a released delivery becomes are all
decided by the listener's `ListenerCore`; this module calls the handler (on the
loop, or on the consumer's thread pool for a `def` handler) and carries out the
actions that come back.

A handler task cancelled by a lost channel or by shutdown is never a failure:
its deliveries are released (the core requeues them), not retried or
dead-lettered. At shutdown, the deliveries that never reached a handler (the
backlog, a partial batch, those the flow gate or the core holds) are released
the same way.
"""

from __future__ import annotations

import asyncio
import traceback
from typing import TYPE_CHECKING, Any

from .._app.invocation import Invocation
from .._core.actions import Action
from .._core.outcome import Outcome
from ..inbox._run import DatabaseDown
from . import cancels, flowing

if TYPE_CHECKING:
    from .._messages.delivery import DeliveryBase
    from .consumer import AsyncConsumer


async def handle(c: AsyncConsumer, ds: list[DeliveryBase]) -> None:
    """Run the handler for `ds` (one delivery, or a batch) until the core is done with it."""
    core = c.core
    if c.tx is not None:
        try:
            ds = [d for d in ds if not await c.tx.duplicate_before_start(d)]
            if not ds:
                return
        except asyncio.CancelledError:  # shutdown or a lost channel: never started
            await release(c, ds)
            raise
    # may they start? (not once stopping, not after their channel closed, the flow gate)
    go = core.begin([d._tracked for d in ds])
    if go.actions:
        await c.execute(core.generation, go.actions)
    while go.wait > 0:  # the rate limit's
        await c.rt.pause(go.wait)  # cut short when the app stops
        go = core.begin(go.run, waited=True)
        if go.actions:
            await c.execute(core.generation, go.actions)
    if not go.run:
        return
    if len(go.run) < len(ds):
        ds = [d for d in ds if d._tracked in go.run]
    inv = Invocation(c.binding, ds)
    try:
        out = await attempt(c, inv)
        while out.rerun:
            await c.rt.pause(out.delay)  # the app's stop cuts the wait short
            out = core.resume(out.rerun)
            if out.actions:
                await c.execute(core.generation, out.actions)
            if not out.rerun:
                return
            inv = inv.again(out.rerun)
            out = await attempt(c, inv)
    except asyncio.CancelledError:  # shutdown or a lost channel: requeue, not a failure
        await release(c, inv.deliveries, started=True)
        raise


async def attempt(c: AsyncConsumer, inv: Invocation) -> Outcome:
    """Call the handler once, then carry out what the core makes of it."""
    b = c.binding
    result: object = None
    exc: BaseException | None = None
    tb = None
    ds = inv.deliveries
    done = c.probe(ds) if c.probe is not None and ds else None
    try:
        if not ds:
            pass
        elif c.tx is not None:
            result = await c.tx.call(inv)  # in the inbox's transaction
        elif c.is_async:
            result = await b.fn(*inv.args())
        else:
            result = await c.rt.loop.run_in_executor(c.pool, _call, b.fn, inv.args)
    except asyncio.CancelledError as e:
        if c.core.shutdown.interrupted(cancels.interruption(asyncio.current_task(), c.rt.stopping)):
            # shutdown or a lost channel: released by handle()
            if done is not None:
                done(e)
            raise
        # The handler's own CancelledError (it raised one, or awaited something that was
        # cancelled) while nobody cancelled its task: a failure like any other. Released,
        # it came straight back to the queue, forever with max_attempts=1.
        exc = e
        tb = traceback.format_exc()
        c.failures.failed(c.spec.name, inv, e)
    except BaseException as e:  # SystemExit and KeyboardInterrupt too: settled, then stop
        exc = e
        tb = traceback.format_exc()
        c.failures.failed(c.spec.name, inv, e)  # before the core moves attempt
    if done is not None:
        done(exc)
    return await conclude(c, inv, result, exc, tb)


async def conclude(
    c: AsyncConsumer, inv: Invocation, result: object, exc: BaseException | None, tb: str | None
) -> Outcome:
    """Carry out what the core makes of a handler's result or exception."""
    if isinstance(exc, DatabaseDown) and c.tx is not None:
        return await c.tx.down(inv, exc)  # returned unstarted, the listener paused
    core = c.core
    out = inv.outcome(core, result, exc, tb)
    if out.actions:
        await c.execute(core.generation, out.actions)
    if out.stop is not None:
        c.rt.fail(out.stop, f"{c.spec.name}: handler raised {type(out.stop).__name__}")
    return out


def _call(fn: Any, args: Any) -> Any:
    return fn(*args())


async def release(c: AsyncConsumer, ds: list[DeliveryBase], *, started: bool = False) -> None:
    """Hand the core deliveries whose handler never ran to the end (`started`: cancelled),
    or never ran (unstarted at shutdown); it returns them to their queue."""
    core = c.core
    acts: list[Action] = []
    for d in ds:
        acts.extend(core.shutdown.release(d._tracked, started=started))
    if acts:
        await c.execute(core.generation, acts)


async def release_unstarted(c: AsyncConsumer) -> None:
    """Shutdown: release what waits for a handler (the backlog, a partial batch) and
    what the gate and the core hold."""
    units = list(c.backlog)
    c.backlog.clear()
    if c.batcher is not None:
        buf = c.batcher.take()
        if buf:
            units.append(buf)
    ds = [d for u in units for d in (u if isinstance(u, list) else [u])]
    ds.extend(flowing.waiting(c))
    if ds:
        await release(c, ds)
