"""AsyncApp's stop closes the connection only once each confirmed copy's original ack
is out (issue item 7).

A stop returns each unstarted delivery as a copy and acks the original once the copy is
confirmed; the ack goes out from the copy's task. The stop waited for the tasks of the
app's publishers only, not for those of each listener's own copy publisher: it closed
the connection with thousands of those acks unsent, and the broker requeued each
original next to its confirmed copy (3,000 messages left as 5,069)."""

from __future__ import annotations

import asyncio
import time

from ackkit import AsyncApp, AsyncDelivery
from ackkit._app.launch import Launch
from ackkit._async.runtime import AsyncRuntime


def test_the_stop_waits_for_the_original_ack_of_a_listeners_confirmed_copy() -> None:
    app = AsyncApp("amqp://guest:guest@localhost:1/%2f")

    @app.listener("q")
    async def handle(d: AsyncDelivery) -> None: ...

    async def main() -> tuple[bool, bool]:
        rt = AsyncRuntime(Launch(app.settings, app.specs))
        c = rt.consumers[0]
        assert c.copies is not rt.publisher  # a listener's copies: a publisher of its own
        c.core.shutdown.stop()
        assert c.core.shutdown.quiescent  # every copy confirmed: the core waits for nothing more
        acked = asyncio.Event()

        async def copy_task() -> None:  # its confirm is in; the original's ack still to go
            await asyncio.sleep(0.1)
            acked.set()

        task = asyncio.get_running_loop().create_task(copy_task())
        c.copies.pending.add(task)
        task.add_done_callback(c.copies.pending.discard)
        await asyncio.wait_for(rt._settle(time.monotonic() + 5.0), 10.0)
        settled_first = acked.is_set()  # the connection closes right after _settle
        await task
        return settled_first, rt.publisher.pending == set()

    settled_first, app_publisher_idle = asyncio.run(main())
    assert app_publisher_idle
    assert settled_first, "the stop went on to close with a confirmed copy's ack unsent"
