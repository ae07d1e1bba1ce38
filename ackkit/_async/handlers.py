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
from .._interpreter import attempts as A
from . import cancels, flowing

if TYPE_CHECKING:
    from .._messages.delivery import DeliveryBase
    from .consumer import AsyncConsumer


async def handle(c: AsyncConsumer, ds: list[DeliveryBase]) -> None:
    """Run the handler for `ds` (one delivery, or a batch) until the core is done with it:
    the interpreter's attempt loop, driven in this task. What the core decides is handed
    to the channel's settler before anything else is awaited (decision order is frame
    order). A cancellation of this task (shutdown, a lost channel) is thrown into the
    loop, which releases the deliveries; then it is raised again."""
    core = c.core
    loop = A.attempts(core, c.binding, ds, inbox=c.tx is not None, probe=c.probe)
    answer: Any = None
    throw: A.Interrupted | None = None
    cancelled: BaseException | None = None
    req: Any
    while True:
        try:
            req = loop.send(answer) if throw is None else loop.throw(throw)
        except StopIteration:
            return
        except A.Interrupted:
            raise cancelled or asyncio.CancelledError() from None
        answer = throw = None
        kind = type(req)
        try:
            if kind is A.Ask:
                answer = req.fn(*req.args)
                if answer.actions:  # a Step with actions
                    await c.execute(answer)
            elif kind is A.Call:
                answer = await call(c, req.inv)
                if answer.interruption is not None:
                    cancelled = answer.exc  # raised again if the core releases the call
            elif kind is A.Pause:
                await c.rt.pause(req.seconds)
            elif kind is A.Failed:
                c.failures.failed(c.spec.name, req.inv, req.exc)
            elif kind is A.Stop:
                exc = req.exc
                c.rt.fail(exc, f"{c.spec.name}: handler raised {type(exc).__name__}")
            elif kind is A.LookUp:
                assert c.tx is not None
                answer = await c.tx.look_up(req.delivery)
            elif kind is A.Down:
                assert c.tx is not None
                await c.tx.down(req.inv, req.exc)
        except asyncio.CancelledError as e:  # shutdown or a lost channel
            cancelled, throw = e, A.Interrupted()


async def call(c: AsyncConsumer, inv: Invocation) -> A.Called:
    """Call the handler once: on the loop, on the consumer's thread pool for a `def`
    handler, or in the inbox's transaction."""
    if not inv.deliveries:
        return A.RETURNED
    b = c.binding
    try:
        if c.tx is not None:
            result = await c.tx.call(inv)  # in the inbox's transaction
        elif c.is_async:
            result = await b.fn(*inv.args())
        else:
            result = await c.rt.loop.run_in_executor(c.pool, _call, b.fn, inv.args)
    except asyncio.CancelledError as e:
        # Released when the cancellation came from outside (shutdown, a lost channel);
        # the handler's own CancelledError (nobody cancelled its task) is a failure like
        # any other: released, it would come straight back, for ever with max_attempts=1.
        why = cancels.interruption(asyncio.current_task(), c.rt.stopping)
        return A.Called(None, e, traceback.format_exc(), why)
    except BaseException as e:  # SystemExit and KeyboardInterrupt too: settled, then stop
        return A.Called(None, e, traceback.format_exc())
    return A.RETURNED if result is None else A.Called(result)


def _call(fn: Any, args: Any) -> Any:
    return fn(*args())


async def release(c: AsyncConsumer, ds: list[DeliveryBase], *, started: bool = False) -> None:
    """Hand the core deliveries whose handler never ran to the end (`started`: cancelled),
    or never ran (unstarted at shutdown); it returns them to their queue."""
    step = c.core.shutdown.release_all([d._tracked for d in ds], started=started)
    if step:
        await c.execute(step)


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
