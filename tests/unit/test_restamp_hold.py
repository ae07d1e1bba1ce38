"""A restamp copy that overtakes its original's ack is held until that ack is out.

A redelivery from a classic queue goes back to the same queue as a copy carrying its
attempt number; the original is acked once the copy is confirmed. The broker may
deliver the copy to the same consumer before that confirm: had its handler started,
a consumer killed then would leave both the original (unacked, redelivered: restamped
again) and the copy in the queue, and the message would run twice per attempt (the
4.3 leg of CI saw attempts [1, 2, 2, 3]). No broker here: the core alone.

"Out" means processed by the broker, not handed to the client library: pika and
aiormq only queue an ack's frame, so the core puts a `Fence` (a round trip on the
channel) between the original's ack and the copy's `Start`, and the runtimes start the
copy only once the broker answered it (a killer copy used to kill its process before
the ack was written: its original came back too, one more dead letter).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import aiormq.exceptions
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ackkit import App, AsyncApp, Delivery, Retry
from ackkit import Consumer as ConsumerOptions
from ackkit._async.consumer import AsyncConsumer
from ackkit._core import headers as H
from ackkit._core.actions import Ack, Action, CopyPurpose, Fence, Reject, Republish, Start
from ackkit._core.brokers import V3
from ackkit._core.listener import ListenerCore
from ackkit._core.policy import ListenerPolicy
from ackkit._core.step import Step
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
    # the ack of the original goes out first, and the broker answers a round trip after it
    assert acts == [Ack(1), Fence(), Start(copy.tag)]


def test_a_copy_arriving_after_the_confirm_starts_after_a_fence() -> None:
    """The original's ack went to the runtime, but may still be in the client's buffer."""
    c = core()
    act = restamped(c)
    assert c.republished(act.token, True) == [Ack(1)]
    copy = c.receive(2, redelivered=False, headers=copy_headers(act), message_id="m")
    assert copy.verdict == [Fence(), Start(copy.tag)]


def test_a_copy_arriving_on_the_next_channel_runs_at_once() -> None:
    """The channel of the original's ack is gone: what it sent was processed or dropped,
    and no round trip on the new channel could tell."""
    c = core()
    act = restamped(c)
    assert c.republished(act.token, True) == [Ack(1)]
    c.channel_closed()
    c.channel_opened()
    copy = c.receive(1, redelivered=False, headers=copy_headers(act), message_id="m")
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
    assert c.shutdown.take_held() == [copy]
    assert c.shutdown.take_held() == []
    assert c.republished(act.token, True) == [Ack(1)]


def test_a_copy_refused_by_the_broker_releases_the_held_one_after_the_requeue() -> None:
    """A nack after the copy was delivered (rare, but the broker may): the original goes
    back, and the copy that did arrive runs (at least once, never held forever)."""
    c = core()
    act = restamped(c)
    copy = c.receive(2, redelivered=False, headers=copy_headers(act), message_id="m")
    acts = c.republished(act.token, False)
    assert acts == [Reject(1, requeue=True), Fence(), Start(copy.tag)]


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
    assert c.shutdown.start(t) is None  # its handler may start
    assert c.finish(t) == [] and c.drain() == [Ack(1)]
    assert c.gating.flow.state.value == "consuming"  # its own queue: consuming is what empties it


def test_later_copies_leave_the_restamp_id_off() -> None:
    c = core()
    act = restamped(c)
    assert c.republished(act.token, True) == [Ack(1)]
    copy = c.receive(2, redelivered=False, headers=copy_headers(act), message_id="m")
    (dead,) = c.finish(copy, ValueError("no"))  # a retry copy (attempt 3)
    assert isinstance(dead, Republish) and dead.set_headers[H.RESTAMP_ID] is None


class Wire:
    """A channel as the core's actions see it: frames are sent in order and processed by
    the broker only when it answers a round trip (`answer`); a `Fence` holds what follows
    it (and what is carried out later) until then; a closed channel drops all of it."""

    def __init__(self, after_close: bool = False) -> None:
        self.after_close = after_close  # the original's channel is gone: nothing to wait for
        self.sent: list[Action] = []
        self.processed = 0  # how many of `sent` the broker has processed
        self.fenced: list[Action] | None = None  # waiting for the broker's answer
        self.open = True
        self.starts: list[Start] = []

    def carry(self, acts: list[Action]) -> None:
        if not self.open:
            return
        if self.fenced is not None:
            self.fenced += acts
            return
        for i, a in enumerate(acts):
            if isinstance(a, Fence):
                self.fenced = list(acts[i + 1 :])
                return
            if isinstance(a, Start):
                self.starts.append(a)
                if a.tag != 1:  # the copy: its original's settle must be processed by now
                    assert self.original_done(), (
                        "the copy started before the broker processed its original's settle"
                    )
            else:
                self.sent.append(a)

    def original_sent(self) -> bool:
        return any(isinstance(x, Ack | Reject) and x.tag == 1 for x in self.sent)

    def original_done(self) -> bool:
        """Has the broker processed the settle of the original (tag 1)?"""
        done = self.sent[: self.processed]
        return self.after_close or any(isinstance(x, Ack | Reject) and x.tag == 1 for x in done)

    def answer(self) -> None:
        """The broker has processed everything sent (a fence's answer arrives)."""
        if not self.open:
            return
        self.processed = len(self.sent)
        rest, self.fenced = self.fenced, None
        if rest is not None:
            self.carry(rest)

    def close(self) -> None:
        self.open, self.fenced = False, None


events = st.lists(
    st.sampled_from(["arrive", "confirm", "nack", "fail", "stop", "answer", "close"]),
    max_size=8,
)


@settings(max_examples=500, deadline=None)
@given(events)
def test_the_copy_starts_once_and_only_after_its_original_is_settled(order: list[str]) -> None:
    """Any order of: the copy arriving, the copy's confirm (ok, nack, not sent), shutdown,
    the broker answering (processing what was sent), the channel closing (the copy then
    arrives on the next one). The copy's handler starts at most once, and only once the
    broker has processed its original's settle (`Wire` checks it at the start, which
    comes after a `Fence`) or that channel is gone; a copy that arrived, on a channel
    still open, either starts or is returned at shutdown once its original is settled."""
    c = core()
    act = restamped(c)
    wire = Wire()
    copy = None
    ran_at_once = returned = 0
    settled_original = closed = False
    for ev in order:
        if ev == "answer":
            wire.answer()
        elif ev == "close" and not closed:
            wire.close()
            c.channel_closed()
            c.channel_opened()
            closed = True
            wire = Wire(after_close=True)
        elif ev == "arrive" and copy is None:
            copy = c.receive(2, redelivered=False, headers=copy_headers(act), message_id="m")
            if copy.verdict is None:  # no fence: nothing of its original may be unwritten
                assert wire.original_done() or not wire.original_sent()
                ran_at_once += 1
            elif copy.verdict == []:  # held
                assert not settled_original
            else:  # its original's settle went to the runtime: a fence, then the copy
                assert settled_original and copy.verdict == [Fence(), Start(copy.tag)]
                wire.carry(copy.verdict)
        elif ev in ("confirm", "nack", "fail") and not settled_original:
            acts = (
                c.republished(act.token, True)
                if ev == "confirm"
                else c.republished(act.token, False, error="boom" if ev == "fail" else None)
            )
            if closed:  # a stale confirm: nothing is sent; a copy that arrived since starts
                assert acts in ([], [Fence(), Start(2)])
                assert not acts or (copy is not None and copy.verdict == [])
                settled_original = True
                wire.carry(acts)
                continue
            if ev == "fail" and isinstance(acts[0], Republish):
                # a minimal copy goes out instead: its confirm settles the original
                assert acts[0].minimal and len(acts) == 1
                act = acts[0]
                continue
            settled_original = True
            starts = [a for a in acts if isinstance(a, Start)]
            copies = [a for a in starts if a.tag != 1]
            if copies:  # settle frames, then the fence, then the copy's start
                assert acts[-2:] == [Fence(), copies[0]] and len(copies) == 1
                assert all(isinstance(a, Ack | Reject) for a in acts[:-2])
            else:  # a refused copy that never arrived: the original runs without it
                assert all(not isinstance(a, Fence) for a in acts)
            wire.carry(acts)
        elif ev == "stop":
            returned += len(c.shutdown.take_held())
    wire.answer()  # in the end the broker answers, if the channel is still open
    started = ran_at_once + sum(1 for a in wire.starts if a.tag != 1)
    assert started + returned <= 1
    if copy is not None and settled_original and copy.generation == c.generation:
        assert started + returned == 1  # (a copy whose channel closed is the broker's)


# -- the runtimes carry it out (fake channels, no broker) ------------------------------


class Channel:
    """Records settle frames and fences; `is_open` for the executors' "still valid?"
    check. A fence (basic.qos) is answered only when the test says so (`answer`)."""

    def __init__(self, log: list[str]) -> None:
        self.log = log
        self.is_open = True
        self.is_closed = False
        self.channel_number = 1
        self.answers: list[Callable[[Any], None]] = []

    def basic_ack(self, tag: int, multiple: bool = False, **_: Any) -> None:
        self.log.append(f"ack {tag}")

    def basic_reject(self, tag: int, requeue: bool = False, **_: Any) -> None:
        self.log.append(f"reject {tag}")

    def basic_nack(self, tag: int, multiple: bool = False, requeue: bool = True, **_: Any) -> None:
        self.log.append(f"nack {tag}")

    def basic_qos(self, prefetch_count: int = 0, callback: Any = None, **_: Any) -> None:
        self.log.append(f"qos {prefetch_count}")  # pika: returns at once, callback later
        self.answers.append(callback)

    def answer(self) -> None:
        """The broker's basic.qos-ok: it has processed every frame sent before."""
        self.answers.pop(0)(SimpleNamespace(method="Basic.QosOk"))


class AioChannel(Channel):
    def __init__(self, log: list[str]) -> None:
        super().__init__(log)
        self.qos_ok: asyncio.Queue[bool] = asyncio.Queue()

    async def basic_ack(self, tag: int, multiple: bool = False, **_: Any) -> None:  # type: ignore[override]
        self.log.append(f"ack {tag}")

    async def basic_qos(self, prefetch_count: int = 0, **_: Any) -> None:  # type: ignore[override]
        self.log.append(f"qos {prefetch_count}")
        if not await self.qos_ok.get():  # aiormq: the channel closed before the answer
            raise aiormq.exceptions.ChannelInvalidStateError("closed")


PREFETCH = 7


def pika_consumer() -> tuple[Consumer, Channel, list[str], list[Republish]]:
    """The App's consumer on a fake channel, its handler start logged as "start <tag>"."""
    app = App("amqp://guest:guest@localhost:1/%2f")

    @app.listener("q", retry=RETRY3, consumer=ConsumerOptions(prefetch=PREFETCH))
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

        def arrive(self, d: Any, _later: Any) -> None:  # handed over at once here
            self.put(d)

        def __getattr__(self, name: str) -> Any:
            return getattr(inbox, name)

    c.inbox = Inbox()  # type: ignore[assignment]
    return c, ch, log, published


def pika_deliver(c: Consumer, tag: int, redelivered: bool, headers: Any) -> None:
    method = SimpleNamespace(
        delivery_tag=tag, redelivered=redelivered, exchange="", routing_key="q"
    )
    props = SimpleNamespace(headers=headers, message_id="m", content_type=None)
    c._on_message(c.channel, method, props, b"{}")


@pytest.mark.parametrize("copy_arrives", ["before the confirm", "after the confirm"])
def test_the_pika_consumer_starts_the_copy_once_the_broker_answered_a_fence(
    copy_arrives: str,
) -> None:
    """The original's ack frame, then basic.qos (the listener's prefetch: a no-op), and
    the copy's handler only when basic.qos-ok arrives: pika's basic_ack only queued the
    frame. The I/O thread is not blocked meanwhile (the answer is a callback)."""
    c, ch, log, published = pika_consumer()
    pika_deliver(c, 1, True, None)  # a classic queue's redelivery: restamped
    (act,) = published
    if copy_arrives == "before the confirm":
        pika_deliver(c, 2, False, copy_headers(act))  # held
        assert log == []
        c.republished(c.core.generation, act.token, True)
    else:
        c.republished(c.core.generation, act.token, True)
        assert log == ["ack 1"]
        pika_deliver(c, 2, False, copy_headers(act))
    assert log == ["ack 1", f"qos {PREFETCH}"] and c.inbox.empty()
    ch.answer()
    assert log == ["ack 1", f"qos {PREFETCH}", "start 2"]


def test_the_pika_consumer_drops_the_copys_start_when_the_channel_closes_first() -> None:
    """No basic.qos-ok before the close: the broker requeues the held copy; it must not
    start (nor anything wait for the fence on the next channel)."""
    c, ch, log, published = pika_consumer()
    pika_deliver(c, 1, True, None)
    (act,) = published
    pika_deliver(c, 2, False, copy_headers(act))
    c.republished(c.core.generation, act.token, True)
    assert log == ["ack 1", f"qos {PREFETCH}"]
    ch.is_open = False
    with c.lock:
        c.core.channel_closed()
    c.channel = None
    ch.answer()  # (pika would not even call back)
    new = c.channel = Channel(log)  # type: ignore[assignment]
    c.core.channel_opened()
    pika_deliver(c, 1, False, None)
    c.send(Step(c.core.generation, [Ack(1)]))  # the outbox does not wait for the old fence
    assert log == ["ack 1", f"qos {PREFETCH}", "start 1", "ack 1"] and not new.answers


def aio_consumer(log: list[str]) -> tuple[AsyncConsumer, AioChannel, list[Republish]]:
    app = AsyncApp("amqp://guest:guest@localhost:1/%2f")

    @app.listener("q", retry=RETRY3, consumer=ConsumerOptions(prefetch=PREFETCH))
    async def handle(d: Delivery) -> None:
        log.append(f"start {d.delivery_tag}")

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
    ch = AioChannel(log)
    c.channel = ch  # type: ignore[assignment]
    c.core.channel_opened()
    return c, ch, published


async def aio_deliver(c: AsyncConsumer, tag: int, redelivered: bool, headers: Any) -> None:
    dv = SimpleNamespace(delivery_tag=tag, redelivered=redelivered, exchange="", routing_key="q")
    props = SimpleNamespace(headers=headers, message_id="m", content_type=None)
    msg = SimpleNamespace(
        channel=c.channel, delivery=dv, header=SimpleNamespace(properties=props), body=b"{}"
    )
    await c._deliver(msg)  # type: ignore[arg-type]


async def settle_down() -> None:
    for _ in range(50):
        await asyncio.sleep(0)


@pytest.mark.parametrize("copy_arrives", ["before the confirm", "after the confirm"])
@pytest.mark.parametrize("answered", [True, False])
def test_the_aio_pika_consumer_starts_the_copy_once_the_broker_answered_a_fence(
    copy_arrives: str, answered: bool
) -> None:
    """As with pika, awaiting basic.qos-ok; a channel that closes before the answer (the
    awaited call fails, the generation is stale) never starts the copy."""

    async def main() -> list[str]:
        log: list[str] = []
        c, ch, published = aio_consumer(log)
        core = c.core
        await aio_deliver(c, 1, True, None)  # a classic queue's redelivery: restamped
        (act,) = published
        if copy_arrives == "before the confirm":
            await aio_deliver(c, 2, False, copy_headers(act))  # held
            assert log == []
            task = asyncio.create_task(c.execute(core.republished(act.token, True)))
        else:
            await c.execute(core.republished(act.token, True))
            assert log == ["ack 1"]
            task = asyncio.create_task(aio_deliver(c, 2, False, copy_headers(act)))
        await settle_down()
        assert log == ["ack 1", f"qos {PREFETCH}"]
        if not answered:
            ch.is_closed = True
            core.channel_closed()
        ch.qos_ok.put_nowait(answered)
        await task
        await settle_down()
        return log

    log = asyncio.run(main())
    assert log == ["ack 1", f"qos {PREFETCH}", *(["start 2"] if answered else [])]
