"""A restamp copy that overtakes its original's ack is held until that ack is out.

A redelivery from a classic queue goes back to the same queue as a copy carrying its
attempt number; the original is acked once the copy is confirmed. The broker may
deliver the copy to the same consumer before that confirm: had its handler started,
a consumer killed then would leave both the original (unacked, redelivered: restamped
again) and the copy in the queue, and the message would run twice per attempt (the
4.3 leg of CI saw attempts [1, 2, 2, 3]). No broker here: the core alone.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from ackkit import App, AsyncApp, Delivery, Retry
from ackkit._async.consumer import AsyncConsumer
from ackkit._core import headers as H
from ackkit._core.actions import Ack, Action, CopyPurpose, Reject, Republish, Start
from ackkit._core.brokers import V3
from ackkit._core.listener import ListenerCore
from ackkit._core.policy import ListenerPolicy
from ackkit._sync.consumer import Consumer

RETRY3 = Retry(max_attempts=3, initial_interval=0.2)


def core(hold: bool = True) -> ListenerCore:
    policy = ListenerPolicy(name="l", queue="q", retry=RETRY3, queue_type="classic")
    c = ListenerCore(policy, wallclock=lambda: 0.0, broker=V3, hold_early_copies=hold)
    c.channel_opened()
    return c


def restamped(c: ListenerCore, tag: int = 1) -> Republish:
    t = c.receive(tag, redelivered=True, headers=None, message_id="m")
    assert t.verdict is not None
    (act,) = t.verdict
    assert isinstance(act, Republish) and act.purpose is CopyPurpose.RESTAMP
    return act


def copy_headers(act: Republish) -> dict[str, Any]:
    """What the copy carries when it comes back (None removes a header)."""
    return {k: v for k, v in act.set_headers.items() if v is not None}


def test_an_early_copy_waits_for_the_originals_ack_then_starts() -> None:
    c = core()
    act = restamped(c)
    copy = c.receive(2, redelivered=False, headers=copy_headers(act), message_id="m")
    assert copy.attempt == 2
    assert copy.verdict == []  # held: no handler, nothing to send
    acts = c.republished(act.token, True)
    assert acts == [Ack(1), Start(copy.tag)]  # the ack of the original goes out first


def test_a_copy_arriving_after_the_confirm_runs_at_once() -> None:
    c = core()
    act = restamped(c)
    assert c.republished(act.token, True) == [Ack(1)]
    copy = c.receive(2, redelivered=False, headers=copy_headers(act), message_id="m")
    assert copy.verdict is None


def test_without_holding_the_copy_runs_at_once() -> None:
    """Pull mode and the Spark source do not hold: their confirms are waited for."""
    c = core(hold=False)
    act = restamped(c)
    copy = c.receive(2, redelivered=False, headers=copy_headers(act), message_id="m")
    assert copy.verdict is None
    assert c.republished(act.token, True) == [Ack(1)]


def test_a_redelivered_copy_is_counted_not_held() -> None:
    """The same copy back after a lost channel is a lost attempt: restamped again."""
    c = core()
    act = restamped(c)
    again = c.receive(2, redelivered=True, headers=copy_headers(act), message_id="m")
    assert again.attempt == 3
    assert again.verdict is not None and isinstance(again.verdict[0], Republish)


def test_a_producers_restamp_id_is_not_held() -> None:
    c = core()
    t = c.receive(1, headers={H.RESTAMP_ID: "not-ours", H.ATTEMPT: 2})
    assert t.verdict is None


def test_shutdown_returns_a_held_copy_and_the_late_confirm_starts_nothing() -> None:
    c = core()
    act = restamped(c)
    copy = c.receive(2, redelivered=False, headers=copy_headers(act), message_id="m")
    assert c.take_held() == [copy]
    assert c.take_held() == []
    assert c.republished(act.token, True) == [Ack(1)]


def test_a_copy_refused_by_the_broker_releases_the_held_one_after_the_requeue() -> None:
    """A nack after the copy was delivered (rare, but the broker may): the original goes
    back, and the copy that did arrive runs (at least once, never held forever)."""
    c = core()
    act = restamped(c)
    copy = c.receive(2, redelivered=False, headers=copy_headers(act), message_id="m")
    acts = c.republished(act.token, False)
    assert acts == [Reject(1, requeue=True), Start(copy.tag)]


def test_a_restamp_copy_refused_by_a_full_queue_runs_the_original_instead() -> None:
    """The queue is at its length limit with reject-publish: requeueing the original would
    bring it straight back for another refused restamp (it used to be rejected, lost,
    after three). It runs now at the attempt it has, and settles like any delivery."""
    c = core()
    t = c.receive(1, redelivered=True, headers=None, message_id="m")
    assert t.verdict is not None
    (act,) = t.verdict
    assert c.republished(act.token, False) == [Start(t.tag)]
    assert not t.settled and t.attempt == 2
    assert c.start(t) is None  # its handler may start
    assert c.finish(t) == [] and c.drain() == [Ack(1)]
    assert c.flow.state.value == "consuming"  # its own queue: consuming is what empties it


def test_later_copies_leave_the_restamp_id_off() -> None:
    c = core()
    act = restamped(c)
    assert c.republished(act.token, True) == [Ack(1)]
    copy = c.receive(2, redelivered=False, headers=copy_headers(act), message_id="m")
    (dead,) = c.finish(copy, ValueError("no"))  # a retry copy (attempt 3)
    assert isinstance(dead, Republish) and dead.set_headers[H.RESTAMP_ID] is None


events = st.lists(st.sampled_from(["arrive", "confirm", "nack", "fail", "stop"]), max_size=6)


@settings(max_examples=300, deadline=None)
@given(events)
def test_the_copy_starts_once_and_only_after_its_original_is_settled(order: list[str]) -> None:
    """Any order of: the copy arriving, the copy's confirm (ok, nack, not sent), shutdown.
    The copy's handler starts at most once, never before the original's settle has been
    decided, and a copy that arrived either starts or is returned at shutdown."""
    c = core()
    act = restamped(c)
    sent: list[Action] = []
    copy = None
    started = returned = 0
    settled_original = False
    for ev in order:
        if ev == "arrive" and copy is None:
            copy = c.receive(2, redelivered=False, headers=copy_headers(act), message_id="m")
            if copy.verdict is None:
                assert settled_original, "ran before the original's ack was out"
                started += 1
            else:
                assert copy.verdict == []
        elif ev in ("confirm", "nack", "fail") and not settled_original:
            acts = (
                c.republished(act.token, True)
                if ev == "confirm"
                else c.republished(act.token, False, error="boom" if ev == "fail" else None)
            )
            if ev == "fail" and isinstance(acts[0], Republish):
                # a minimal copy goes out instead: its confirm settles the original
                assert acts[0].minimal and len(acts) == 1
                act = acts[0]
                continue
            settled_original = True
            sent += acts
            starts = [a for a in acts if isinstance(a, Start)]
            assert all(isinstance(a, Ack | Reject) for a in acts[: len(acts) - len(starts)])
            # a refused copy that never arrived: the original runs without it (tag 1)
            started += sum(1 for a in starts if a.tag != 1)
        elif ev == "stop":
            returned += len(c.take_held())
    assert started + returned <= 1
    if copy is not None and settled_original:
        assert started + returned == 1


# -- the runtimes carry it out (fake channels, no broker) ------------------------------


class Channel:
    """Records settle frames; `is_open` for the executors' "still valid?" check."""

    def __init__(self, log: list[str]) -> None:
        self.log = log
        self.is_open = True
        self.is_closed = False
        self.channel_number = 1

    def basic_ack(self, tag: int, multiple: bool = False, **_: Any) -> None:
        self.log.append(f"ack {tag}")

    def basic_reject(self, tag: int, requeue: bool = False, **_: Any) -> None:
        self.log.append(f"reject {tag}")

    def basic_nack(self, tag: int, multiple: bool = False, requeue: bool = True, **_: Any) -> None:
        self.log.append(f"nack {tag}")


class AioChannel(Channel):
    async def basic_ack(self, tag: int, multiple: bool = False, **_: Any) -> None:  # type: ignore[override]
        self.log.append(f"ack {tag}")


def test_the_pika_consumer_starts_a_held_copy_after_sending_the_originals_ack() -> None:

    app = App("amqp://guest:guest@localhost:1/%2f")

    @app.listener("q", retry=RETRY3)
    def handle(d: Delivery) -> None: ...

    log: list[str] = []
    published: list[Republish] = []
    rt = SimpleNamespace(
        app=app,
        connection=SimpleNamespace(is_open=True),
        stopping=False,
        call_soon=lambda fn: fn(),
        publisher=SimpleNamespace(publish=lambda c, gen, a: published.append(a)),
    )
    c = Consumer(rt, app.specs[0], None)  # type: ignore[arg-type]
    c.copies = rt.publisher  # type: ignore[assignment]
    ch = c.channel = Channel(log)  # type: ignore[assignment]
    c.core.channel_opened()
    inbox = c.inbox

    class Inbox:
        def put(self, d: Any) -> None:
            log.append(f"start {d.delivery_tag}")
            inbox.put(d)

        def __getattr__(self, name: str) -> Any:
            return getattr(inbox, name)

    c.inbox = Inbox()  # type: ignore[assignment]

    def deliver(tag: int, redelivered: bool, headers: dict[str, Any] | None) -> None:
        method = SimpleNamespace(
            delivery_tag=tag, redelivered=redelivered, exchange="", routing_key="q"
        )
        props = SimpleNamespace(headers=headers, message_id="m", content_type=None)
        c._on_message(ch, method, props, b"{}")

    deliver(1, True, None)  # a classic queue's redelivery: restamped
    (act,) = published
    deliver(2, False, copy_headers(act))  # the copy, before its confirm
    assert log == [] and c.inbox.empty()
    c.republished(c.core.generation, act.token, True)
    assert log == ["ack 1", "start 2"]


def test_the_aio_pika_consumer_starts_a_held_copy_after_sending_the_originals_ack() -> None:

    app = AsyncApp("amqp://guest:guest@localhost:1/%2f")
    log: list[str] = []

    @app.listener("q", retry=RETRY3)
    async def handle(d: Delivery) -> None:
        log.append(f"start {d.delivery_tag}")

    async def main() -> None:
        published: list[Republish] = []
        loop = asyncio.get_running_loop()
        rt = SimpleNamespace(
            app=app,
            loop=loop,
            publisher=SimpleNamespace(submit=lambda c, a, original: published.append(a)),
            spawn=loop.create_task,
        )
        c = AsyncConsumer(rt, app.specs[0], None)  # type: ignore[arg-type]
        c.copies = rt.publisher  # type: ignore[assignment]
        c.channel = AioChannel(log)  # type: ignore[assignment]
        core = c.core
        core.channel_opened()
        ch = c.channel

        async def deliver(tag: int, redelivered: bool, headers: dict[str, Any] | None) -> None:
            dv = SimpleNamespace(
                delivery_tag=tag, redelivered=redelivered, exchange="", routing_key="q"
            )
            props = SimpleNamespace(headers=headers, message_id="m", content_type=None)
            msg = SimpleNamespace(
                channel=ch, delivery=dv, header=SimpleNamespace(properties=props), body=b"{}"
            )
            await c._deliver(msg)  # type: ignore[arg-type]

        await deliver(1, True, None)  # a classic queue's redelivery: restamped
        (act,) = published
        await deliver(2, False, copy_headers(act))  # the copy, before its confirm
        assert log == []
        await c.execute(core.generation, core.republished(act.token, True))
        for _ in range(50):
            await asyncio.sleep(0)
        assert log == ["ack 1", "start 2"]

    asyncio.run(main())
