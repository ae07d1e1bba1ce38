"""Per-key serial mode across a reconnect (no broker): a delivery of a closed channel
never runs, and the serial key it holds goes to the next delivery, so a redelivery on
the new channel is not held behind it for ever. Both ways a delivery can be left
unstarted by a close: queued for a worker (its `begin` finds it stale), and let
through by a `Run` that the executor could no longer carry out (it still hands the
delivery to a worker, whose `begin` finds it stale)."""

from __future__ import annotations

from ackkit._core.actions import Run
from ackkit._core.listener import ListenerCore
from ackkit._core.step import Step
from ackkit._core.tracked import Tracked
from tests.unit.test_gating import SERIAL, gated_core


def recv(c: ListenerCore, tag: int, key: str, redelivered: bool = False) -> Tracked:
    return c.receive(tag, redelivered=redelivered, headers={"k": key})


def reconnect(c: ListenerCore) -> None:
    c.channel_closed()
    c.channel_opened()


def test_a_queued_delivery_of_a_closed_channel_frees_its_key() -> None:
    c = gated_core(SERIAL)
    t1 = recv(c, 1, "a")
    assert t1.verdict is None  # runs: it holds key a
    reconnect(c)  # before a worker began it
    assert c.begin([t1]).run == ()  # stale: never runs
    again = recv(c, 1, "a", redelivered=True)  # the broker's redelivery
    assert again.verdict is None, again.verdict  # runs, not held behind t1


def test_a_run_that_came_too_late_frees_its_key() -> None:
    c = gated_core(SERIAL)
    t1, t2 = recv(c, 1, "a"), recv(c, 2, "a")
    assert t1.verdict is None and t2.verdict == []  # t2 waits behind t1
    assert c.begin([t1]).run == (t1,)
    out = c.handled([t1], None)
    assert Run(2) in out.actions  # t2 takes the key...
    reconnect(c)  # ...but its channel closed before the Run was carried out
    assert c.begin([t2]).run == ()  # the executor still handed it to a worker: stale
    again = recv(c, 1, "a", redelivered=True)
    assert again.verdict is None, again.verdict


def test_a_running_holder_keeps_its_key_until_it_ends() -> None:
    c = gated_core(SERIAL)
    t1 = recv(c, 1, "a")
    assert c.begin([t1]).run == (t1,)  # its handler runs on
    reconnect(c)
    again = recv(c, 1, "a", redelivered=True)
    assert again.verdict == []  # serial: waits for the running one
    out = c.handled([t1], None)  # its ack is dropped (stale); the key moves on
    assert Run(again.tag) in out.actions


def test_the_pika_executor_hands_a_run_of_a_closed_channel_to_a_worker() -> None:
    """The executor drops a closed channel's settles, but not its Runs: the delivery goes
    to a worker, whose `begin` finds it stale and frees its key (above)."""
    from tests.unit.test_restamp_hold import pika_consumer, pika_deliver

    c, ch, log, _ = pika_consumer()
    pika_deliver(c, 1, False, None)
    assert log == ["start 1"]
    gen = c.core.generation
    ch.is_open = False
    with c.lock:
        c.core.channel_closed()
    c.execute(Step(gen, [Run(1)]))
    assert log == ["start 1", "start 1"]
