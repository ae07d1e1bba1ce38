"""Unit tests of BatchLedger: the core's decisions for batch-at-a-time consumers (Spark)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ackkit._core.actions import Ack, Republish
from ackkit._core.errors import BadPayload
from ackkit._core.listener import ListenerCore, Tracked
from ackkit._core.policy import FlushPolicy, ListenerPolicy
from ackkit.spark._core.batches import Admission, BatchLedger, OnInvalid


def make_core(prefetch: int = 1000) -> ListenerCore:
    policy = ListenerPolicy(
        name="spark",
        queue="q",
        prefetch=prefetch,
        flush=FlushPolicy(max_pending=prefetch + 1, interval=0.2),
    )
    c = ListenerCore(policy, wallclock=lambda: 0.0, clock=lambda: 0.0)
    c.channel_opened()
    return c


class Feed:
    """Deliveries on the core's current channel, tags growing from 1."""

    def __init__(self, core: ListenerCore) -> None:
        self.core = core
        self.tag = 0

    def __call__(self, *keys: str | None) -> list[tuple[Tracked, str | None]]:
        out = []
        for k in keys:
            self.tag += 1
            out.append((self.core.receive(self.tag), k))
        return out

    def reopened(self) -> None:
        self.tag = 0


def acks(actions) -> list[Ack]:
    return [a for a in actions if isinstance(a, Ack)]


def test_batch_rows_are_acked_only_when_written_as_one_multiple_ack():
    core = make_core()
    led = BatchLedger(core)
    feed = Feed(core)
    plan = led.plan(0, feed("a", "b", "c"))
    assert plan.end == 3
    assert plan.rows == [0, 1, 2]
    assert plan.actions == []
    assert core.tick() == []  # nothing is pending before the write
    w = led.written(3)
    assert w.actions == [Ack(3, multiple=True)]
    assert (w.acked, w.held, w.stale) == (3, 0, 0)
    assert led.written(3).actions == []  # settle once


def test_written_covers_every_earlier_batch_and_not_later_ones():
    core = make_core()
    led = BatchLedger(core)
    feed = Feed(core)
    led.plan(0, feed("a", "b"))
    led.plan(2, feed("c"))
    led.plan(3, feed("d", "e"))
    w = led.written(3)
    assert w.actions == [Ack(3, multiple=True)]
    assert led.unwritten == 2
    assert led.written(5).actions == [Ack(5, multiple=True)]


def test_keyless_deliveries_are_always_new():
    core = make_core()
    led = BatchLedger(core)
    feed = Feed(core)
    plan = led.plan(0, feed(None, None, "x", None))
    assert plan.admissions == [Admission.NEW] * 4
    assert plan.end == 4


def test_copy_of_an_unwritten_batch_is_held_and_acked_with_it():
    core = make_core()
    led = BatchLedger(core)
    feed = Feed(core)
    led.plan(0, feed("a", "b"))
    plan = led.plan(2, feed("a", "c"))
    assert plan.admissions == [Admission.HELD, Admission.NEW]
    assert plan.rows == [1]
    assert plan.end == 3
    w = led.written(2)
    # tags 1, 2 (batch rows) and 3 (the held copy) form the prefix; 4 is batch (2, 3]
    assert w.actions == [Ack(3, multiple=True)]
    assert (w.acked, w.held) == (3, 1)
    assert led.written(3).actions == [Ack(4, multiple=False)]


def test_copy_of_a_written_batch_is_acked_at_once():
    core = make_core()
    led = BatchLedger(core)
    feed = Feed(core)
    led.plan(0, feed("a"))
    led.written(1)
    plan = led.plan(1, feed("a"))
    assert plan.admissions == [Admission.SETTLED]
    assert plan.end == 1
    assert plan.actions == [Ack(2, multiple=False)]


def test_copies_within_one_batch_become_one_row():
    core = make_core()
    led = BatchLedger(core)
    feed = Feed(core)
    plan = led.plan(0, feed("a", "a", "b"))
    assert plan.admissions == [Admission.NEW, Admission.HELD, Admission.NEW]
    assert plan.end == 2
    assert led.written(2).actions == [Ack(3, multiple=True)]


def test_restored_keys_suppress_redeliveries_after_a_restart():
    core = make_core()
    led = BatchLedger(core, written_upto=10)
    led.restore(10, ["a", "b"])  # written before the crash, acks lost
    led.restore(12, ["c", "d"])  # handed out, not written: Spark replays it
    feed = Feed(core)
    plan = led.plan(12, feed("a", "c", "e", "b", "d"))
    assert plan.admissions == [
        Admission.SETTLED,
        Admission.HELD,
        Admission.NEW,
        Admission.SETTLED,
        Admission.HELD,
    ]
    assert plan.end == 13
    # tag 1 acked now; tag 4 is behind in-flight tags 2, 3: acked on its own
    assert plan.actions == [Ack(1, multiple=False), Ack(4, multiple=False)]
    w = led.written(12)  # the replay of (10, 12] was written
    assert (w.acked, w.held) == (2, 2)
    assert w.actions == [Ack(2, multiple=False), Ack(5, multiple=False)]
    assert led.written(13).actions == [Ack(3, multiple=False)]


def test_a_new_batch_cannot_start_inside_a_remembered_one():
    core = make_core()
    led = BatchLedger(core)
    led.restore(5, ["a"])
    with pytest.raises(ValueError):
        led.plan(3, Feed(core)("x"))


def test_stale_deliveries_are_skipped_and_never_acked():
    core = make_core()
    led = BatchLedger(core)
    feed = Feed(core)
    old = feed("x", "y")
    led.plan(0, feed("a", "b"))
    assert led.channel_closed() == 2
    core.channel_opened()
    plan = led.plan(2, old)
    assert plan.admissions == [Admission.STALE, Admission.STALE]
    assert plan.end == 2
    w = led.written(2)
    assert w.actions == []
    # the redelivered copies of batch (0, 2] on the new channel are settled at once
    feed.reopened()
    plan = led.plan(2, feed("a", "b"))
    assert plan.admissions == [Admission.SETTLED, Admission.SETTLED]
    assert plan.actions == [Ack(2, multiple=True)]


def test_rows_of_a_closed_channel_are_not_acked_when_written():
    core = make_core()
    led = BatchLedger(core)
    feed = Feed(core)
    batch = feed("a", "b")
    led.plan(0, batch)
    core.channel_closed()  # the runtime forgot to tell the ledger: the core still fences
    core.channel_opened()
    w = led.written(2)
    assert w.actions == []
    assert (w.acked, w.stale) == (0, 2)
    assert all(t.settled for t, _ in batch)


def test_forget_drops_keys_of_written_batches_only():
    core = make_core()
    led = BatchLedger(core)
    feed = Feed(core)
    led.plan(0, feed("a", "b"))
    led.plan(2, feed("c"))
    led.written(2)
    assert led.forget(10) == 2  # (2, 3] is not written: its key stays
    assert led.remembered == 1
    assert led.batch_of("c") == 3
    assert led.plan(3, feed("a")).admissions == [Admission.NEW]


def test_dead_letter_of_a_poison_delivery_does_not_block_the_batch_ack():
    core = make_core()
    led = BatchLedger(core)
    feed = Feed(core)
    [(bad, _)] = feed("p")
    acts = core.finish(bad, BadPayload("not an order"))
    [rep] = acts
    assert isinstance(rep, Republish) and rep.routing_key == "q.dlq"
    led.plan(0, feed("a", "b"))
    w = led.written(2)
    # tag 1 waits for its DLQ confirm, so the batch is acked tag by tag
    assert w.actions == [Ack(2), Ack(3)]
    assert core.republished(rep.token, True) == [Ack(1)]  # acked at once after the confirm
    assert core.drain() == []


@pytest.mark.parametrize(
    ("on_invalid", "dead_lettered"),
    [(OnInvalid.FAIL, False), (OnInvalid.DEAD_LETTER, True)],
)
def test_an_invalid_row_fails_its_batch_or_is_dead_lettered(on_invalid, dead_lettered):
    core = make_core()
    led = BatchLedger(core, on_invalid=on_invalid)
    feed = Feed(core)
    [(bad, _)] = feed("p")
    acts = led.invalid(bad, "not an order")
    if not dead_lettered:
        assert acts is None  # it stays a row: the query fails on it, nothing is acked
        assert led.plan(0, [(bad, "p")]).rows == [0]
        assert core.drain() == []
        return
    [rep] = acts
    assert isinstance(rep, Republish) and rep.routing_key == "q.dlq"
    assert core.republished(rep.token, True) == [Ack(1)]
    with pytest.raises(ValueError):  # settled: never a row of a batch
        led.plan(0, [(bad, "p")])


@pytest.mark.parametrize(
    ("max_pending", "accepted"), [(999, False), (1000, False), (1001, True), (5000, True)]
)
def test_a_batch_ledger_refuses_a_core_that_flushes_by_count(max_pending, accepted):
    policy = ListenerPolicy(
        name="spark",
        queue="q",
        prefetch=1000,
        flush=FlushPolicy(max_pending=max_pending, interval=0.2),
    )
    core = ListenerCore(policy, wallclock=lambda: 0.0, clock=lambda: 0.0)
    if accepted:
        BatchLedger(core)
    else:
        with pytest.raises(ValueError, match="max_pending"):
            BatchLedger(core)


def test_the_derived_flush_policy_never_flushes_a_full_window_by_count():
    fp = BatchLedger.flush_policy(1000)
    assert fp.max_pending == 1001 and fp.interval == 0.2
    core = ListenerCore(
        ListenerPolicy(name="spark", queue="q", prefetch=3, flush=BatchLedger.flush_policy(3)),
        wallclock=lambda: 0.0,
        clock=lambda: 0.0,
    )
    core.channel_opened()
    led = BatchLedger(core)
    feed = Feed(core)
    led.plan(0, feed("a", "b", "c"))
    assert core.tick() == []  # a full window, nothing flushed before the write
    assert led.written(3).actions == [Ack(3, multiple=True)]


def test_already_settled_delivery_is_refused():
    core = make_core()
    led = BatchLedger(core)
    [(t, _)] = Feed(core)("a")
    core.finish(t)
    with pytest.raises(ValueError):
        led.plan(0, [(t, "a")])


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["deliver", "plan", "write", "reopen"]), st.integers(0, 6)),
        max_size=60,
    )
)
def test_every_tag_is_acked_once_and_only_on_its_own_channel(ops):
    """Whatever the interleaving: acks are never repeated, never cover an in-flight row,
    and every key is handed out as a row at most once."""
    core = make_core()
    led = BatchLedger(core)
    tag = 0
    buffer: list[tuple[Tracked, str | None]] = []
    state: dict[int, str] = {}  # tag -> "inflight" | "acked" on the current channel
    in_batch: dict[int, int] = {}  # tag -> batch end it waits for (rows and held copies)
    rows_by_key: dict[str, int] = {}
    start = 0

    def apply(actions):
        for a in actions:
            assert isinstance(a, Ack)
            covered = [t for t in state if t <= a.tag] if a.multiple else [a.tag]
            for t in covered:
                if state[t] == "acked" and not a.multiple:
                    raise AssertionError(f"tag {t} acked twice")
                if state[t] == "inflight":
                    assert t in may_ack, f"tag {t} acked before its batch was written"
                    state[t] = "acked"

    may_ack: set[int] = set()
    for op, n in ops:
        if op == "deliver":
            tag += 1
            key = f"k{n}" if n < 5 else None
            t = core.receive(tag)
            buffer.append((t, key))
            state[tag] = "inflight"
        elif op == "plan":
            plan = led.plan(start, buffer)
            for i, adm in enumerate(plan.admissions):
                t, key = buffer[i]
                if adm is Admission.NEW and key is not None:
                    assert key not in rows_by_key, f"key {key} handed out twice"
                    rows_by_key[key] = plan.end
                if adm in (Admission.NEW, Admission.HELD):
                    end = plan.end if adm is Admission.NEW else led.batch_of(key) or plan.end
                    in_batch[t.tag] = end
                if adm is Admission.SETTLED:
                    may_ack.add(t.tag)
            apply(plan.actions)
            start = plan.end
            buffer = []
        elif op == "write":
            upto = min(start, led.written_upto + n)
            may_ack.update(t for t, e in in_batch.items() if e <= upto)
            apply(led.written(upto).actions)
        else:
            led.channel_closed()
            core.channel_opened()
            tag = 0
            state = {}
            in_batch = {}
            may_ack = set()
            buffer = []
    # everything handed out and written is acked in the end
    may_ack.update(in_batch)
    apply(led.written(start).actions)
    assert all(s == "acked" for t, s in state.items() if t in in_batch)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.sampled_from(["deliver", "settle", "reopen"]), max_size=40),
    st.integers(2, 12),
    st.sampled_from(["auto", "transacted"]),
)
def test_finish_all_decides_what_finish_one_by_one_does(ops, max_pending, mode):
    """A written batch is settled with `finish_all` (less work per delivery): the same
    actions, counters and outstanding deliveries as `finish` called for each, whatever
    was settled before, whichever channel a delivery came on, and wherever a flush by
    count falls."""
    from ackkit._core.policy import AckMode

    def core() -> ListenerCore:
        policy = ListenerPolicy(
            name="spark",
            queue="q",
            prefetch=0,
            mode=AckMode(mode),
            flush=FlushPolicy(max_pending=max_pending, interval=0.2),
        )
        c = ListenerCore(policy, wallclock=lambda: 0.0, clock=lambda: 0.0)
        c.channel_opened()
        return c

    one, many = core(), core()
    ts: list[tuple[Tracked, Tracked]] = []
    tag = 0
    for op in ops:
        if op == "deliver":
            tag += 1
            ts.append((one.receive(tag), many.receive(tag)))
        elif op == "settle" and ts:
            a, b = ts[len(ts) // 2]
            assert one.finish(a) == many.finish(b)
        elif op == "reopen":
            for c in (one, many):
                c.channel_closed()
                c.channel_opened()
            tag = 0
    expected = []
    for a, _ in ts:
        expected.extend(one.finish(a))
    assert many.finish_all([b for _, b in ts]) == expected
    assert many.counters.snapshot() == one.counters.snapshot()
    assert [t.tag for t in many._ledger.unsettled()] == [t.tag for t in one._ledger.unsettled()]
    assert many.gauges().pending_acks == one.gauges().pending_acks
    assert many.drain() == one.drain()
