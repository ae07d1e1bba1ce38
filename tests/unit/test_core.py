"""Unit tests of the sans-I/O core: decisions only, no broker."""

from __future__ import annotations

import pytest

from ackkit import (
    AckMode,
    DeadLetterMessage,
    RejectMessage,
    RequeueMessage,
    Retry,
    RetryLater,
    RetryStrategy,
    Unsettled,
)
from ackkit._core import headers as H
from ackkit._core.actions import Ack, Nack, Reinvoke, Reject, Republish, TxCommit, TxSelect
from ackkit._core.listener import ListenerCore
from ackkit._core.policy import FlushPolicy, ListenerPolicy
from ackkit._core.window import TagWindow
from ackkit.errors import AlreadySettled, BadPayload, SettleNotAllowed


def core(**kw) -> ListenerCore:
    kw.setdefault("name", "l")
    kw.setdefault("queue", "q")
    c = ListenerCore(ListenerPolicy(**kw), wallclock=lambda: 0.0)
    c.channel_opened()
    return c


def test_window_prefix_stops_at_in_flight_tag():
    w = TagWindow()
    for t in (5, 6, 7, 8):
        w.add(t)
    w.mark_ack(5)
    w.mark_ack(7)
    w.mark_ack(8)
    assert w.take_prefix() == (5, 1)
    assert w.take_prefix() == (0, 0)
    assert w.take_stragglers() == [7, 8]
    w.mark_ack(6)
    assert w.take_prefix() == (6, 1)


def test_seed_001_multiple_covers_5_to_8():
    c = core(prefetch=4, flush=FlushPolicy(max_pending=4, interval=1))
    ts = [c.receive(t) for t in (5, 6, 7, 8)]
    acts = []
    for t in ts:
        acts += c.finish(t)
    assert acts == [Ack(8, multiple=True)]


def test_auto_batches_by_count_derived_from_prefetch():
    c = core(prefetch=100)
    assert c.policy.flush_policy.max_pending == 65
    ts = [c.receive(t) for t in range(1, 101)]
    acts = [a for t in ts for a in c.finish(t)]
    assert acts == [Ack(65, multiple=True)]
    assert c.drain() == [Ack(100, multiple=True)]


def test_time_flush_acks_pending_after_interval():
    now = [0.0]
    c = ListenerCore(ListenerPolicy(name="l", queue="q", prefetch=100), clock=lambda: now[0])
    c.channel_opened()
    t = c.receive(1)
    assert c.finish(t) == []
    assert c.tick() == []
    now[0] = 0.2
    assert c.tick() == [Ack(1)]


def test_blocked_head_does_not_stall_the_window():
    c = core(prefetch=10, flush=FlushPolicy(max_pending=3, interval=1))
    ts = [c.receive(t) for t in range(1, 6)]
    acts = []
    for t in ts[1:4]:  # 1 stays in the handler
        acts += c.finish(t)
    assert acts == [Ack(2), Ack(3), Ack(4)]


def test_handler_failure_default_dead_letters_with_reason():
    c = core()
    t = c.receive(1, headers={}, exchange="ex", routing_key="rk")
    (a,) = c.finish(t, ValueError("boom"), "Traceback...")
    assert isinstance(a, Republish)
    assert a.routing_key == "q.dlq" and a.purpose == "dead-letter"
    h = a.set_headers
    assert h[H.REASON].startswith("attempts exhausted")
    assert h[H.ERROR_TYPE] == "ValueError" and h[H.ERROR_MESSAGE] == "boom"
    assert h[H.ORIGINAL_EXCHANGE] == "ex" and h[H.ORIGINAL_ROUTING_KEY] == "rk"
    assert h[H.ORIGINAL_QUEUE] == "q" and h[H.ATTEMPTS] == 1
    assert h[H.ERROR_TRACEBACK] == "Traceback..."
    # acked at once once the copy is confirmed (not batched: a cut would duplicate it)
    assert c.republished(a.token, True) == [Ack(1)] and c.drain() == []


def test_failed_republish_requeues_original():
    c = core()
    t = c.receive(1)
    (a,) = c.finish(t, ValueError())
    assert c.republished(a.token, False) == [Reject(1, requeue=True)]


def test_no_dlq_means_reject_to_dlx():
    c = core(dead_letter=None)
    t = c.receive(1)
    assert c.finish(t, ValueError()) == [Reject(1, requeue=False)]


def test_broker_retry_then_dead_letter():
    c = core(retry=Retry(max_attempts=3, initial_interval=1.0, multiplier=2.0))
    assert [q.name for q in c.queues.topology()] == ["q.dlq", "q.retry.1000ms", "q.retry.2000ms"]
    t = c.receive(1)
    (a,) = c.finish(t, ValueError())
    assert a.routing_key == "q.retry.1000ms" and a.set_headers[H.ATTEMPT] == 2
    t2 = c.receive(2, headers={H.ATTEMPT: 2})
    (b,) = c.finish(t2, ValueError())
    assert b.routing_key == "q.retry.2000ms" and b.set_headers[H.ATTEMPT] == 3
    t3 = c.receive(3, headers={H.ATTEMPT: 3})
    (d,) = c.finish(t3, ValueError())
    assert d.routing_key == "q.dlq" and d.set_headers[H.ATTEMPTS] == 3


def test_in_process_retry_reinvokes_with_backoff():
    r = Retry(max_attempts=3, initial_interval=0.5, multiplier=2, strategy=RetryStrategy.IN_PROCESS)
    c = core(retry=r)
    t = c.receive(1)
    assert c.finish(t, ValueError()) == [] and t.again == Reinvoke(1, 0.5, 2)
    assert c.finish(t, ValueError()) == [] and t.again == Reinvoke(1, 1.0, 3)
    (a,) = c.finish(t, ValueError())
    assert isinstance(a, Republish) and a.purpose == "dead-letter"


def test_bad_payload_and_fatal_are_not_retried():
    c = core(retry=Retry(max_attempts=5, fatal=(KeyError,)))
    (a,) = c.finish(c.receive(1), BadPayload("not json"))
    assert a.purpose == "dead-letter" and "bad payload" in a.set_headers[H.REASON]
    (b,) = c.finish(c.receive(2), KeyError("k"))
    assert b.purpose == "dead-letter" and "non-retryable" in b.set_headers[H.REASON]


def test_signals():
    c = core(retry=Retry(max_attempts=3))
    assert c.finish(c.receive(1), RequeueMessage()) == [Reject(1, requeue=True)]
    (a,) = c.finish(c.receive(2), DeadLetterMessage("nope"))
    assert a.purpose == "dead-letter" and a.set_headers[H.REASON] == "nope"
    (b,) = c.finish(c.receive(3), RetryLater(delay=5))
    assert b.routing_key == "q.retry.5000ms" and b.declare is not None
    (d,) = c.finish(c.receive(4), RejectMessage())
    assert d.purpose == "dead-letter"


def test_attempt_from_headers():
    assert H.attempt_of({}, False) == 1
    assert H.attempt_of({}, True) == 2
    assert H.attempt_of({H.ATTEMPT: 3}, False) == 3
    assert (
        H.attempt_of({H.ATTEMPT: 3, "x-delivery-count": 2}, True, count_header=H.X_DELIVERY_COUNT)
        == 5
    )
    # A classic queue passes a producer's x-delivery-count through: never read there.
    assert H.attempt_of({H.ATTEMPT: 3, "x-delivery-count": 2}, True) == 4
    assert H.attempt_of({"x-delivery-count": 0}, True, count_header=H.X_DELIVERY_COUNT) == 2
    # "²" and "⑴" are digits to str.isdigit() but not to int(): they escaped as a plain
    # ValueError (dead-lettered as "unreadable message"); "٣" was read as attempt 3
    for bad in ("abc", -1, 10**12, b"\xff", True, "\u00b2", "\u2474", "\u0663", "\uff13"):
        with pytest.raises(H.BadAttemptHeader):
            H.attempt_of({H.ATTEMPT: bad}, False)


def test_garbage_attempt_header_dead_letters_before_the_handler():
    c = core()
    t = c.receive(1, headers={H.ATTEMPT: "garbage"})
    assert t.verdict is not None and t.verdict[0].purpose == "dead-letter"


def test_redelivery_past_max_attempts_is_dead_lettered_on_arrival():
    c = core(retry=Retry(max_attempts=3))
    t = c.receive(1, redelivered=True, headers={H.ATTEMPT: 3})
    assert t.verdict and "exhausted" in t.verdict[0].set_headers[H.REASON]


def test_settle_once_and_manual_forgotten_ack():
    c = core(mode=AckMode.MANUAL)
    t = c.receive(1)
    assert c.settle(t, "ack") == []
    with pytest.raises(AlreadySettled):
        c.settle(t, "ack")
    t2 = c.receive(2)
    (a,) = c.finish(t2)  # returned without settling
    assert a.purpose == "dead-letter" and "without settling" in a.set_headers[H.REASON]
    c3 = core(mode=AckMode.MANUAL, on_unsettled=Unsettled.REQUEUE)
    assert c3.finish(c3.receive(1)) == [Reject(1, requeue=True)]


def test_stale_delivery_is_never_settled_on_new_channel():
    c = core(mode=AckMode.MANUAL)
    t = c.receive(1)
    c.channel_closed()
    c.channel_opened()
    assert c.settle(t, "ack") == []
    assert c.counters.snapshot()["dropped_stale"] == 1


def test_client_mode_ack_covers_earlier_deliveries():
    c = core(mode=AckMode.CLIENT, prefetch=10, flush=FlushPolicy(max_pending=1, interval=1))
    ts = [c.receive(t) for t in range(1, 6)]
    for t in ts[:4]:
        assert c.finish(t) == []  # left unsettled on purpose
    assert c.settle(ts[4], "ack") == [Ack(5, multiple=True)]


def test_client_mode_full_window_is_settled_by_default_not_stalled():
    c = core(mode=AckMode.CLIENT, prefetch=3)
    ts = [c.receive(t) for t in range(1, 4)]
    assert c.finish(ts[0]) == [] and c.finish(ts[1]) == []
    acts = c.finish(ts[2])
    assert len(acts) == 3 and all(a.purpose == "dead-letter" for a in acts)


def test_nack_multiple_flushes_acks_first():
    c = core(mode=AckMode.CLIENT, prefetch=10, flush=FlushPolicy(max_pending=5, interval=1))
    ts = [c.receive(t) for t in range(1, 6)]
    acts = c.settle(ts[4], "nack", requeue=True, multiple=True)
    assert acts == [Nack(5, multiple=True, requeue=True)]


def test_nack_without_requeue_dead_letters_not_drops():
    c = core(mode=AckMode.MANUAL)
    (a,) = c.settle(c.receive(1), "nack", requeue=False)
    assert a.purpose == "dead-letter"


def test_individual_mode_sends_each_ack_alone():
    c = core(mode=AckMode.INDIVIDUAL, prefetch=10)
    ts = [c.receive(t) for t in range(1, 4)]
    assert c.settle(ts[1], "ack") == [Ack(2)]
    assert c.settle(ts[0], "ack") == [Ack(1)]
    with pytest.raises(SettleNotAllowed):
        c.settle(ts[2], "ack", multiple=True)


def test_transacted_commits_acks_and_requeues_batch_on_failure():
    c = ListenerCore(
        ListenerPolicy(name="l", queue="q", mode=AckMode.TRANSACTED, prefetch=10),
        wallclock=lambda: 0.0,
    )
    assert c.channel_opened() == [TxSelect()]
    ts = [c.receive(t) for t in range(1, 4)]
    assert c.finish(ts[0]) == [] and c.finish(ts[1]) == []
    acts = c.finish(ts[2], ValueError())
    # the successful handlers' acks become requeues that are no failure: basic.nack
    assert acts[:2] == [Nack(1, requeue=True), Nack(2, requeue=True)]
    assert acts[2].purpose == "dead-letter"
    assert c.republished(acts[2].token, True) == []
    assert c.drain() == [Ack(3), TxCommit()]


def test_none_mode_cannot_settle_but_keeps_failures_in_dlq():
    c = core(mode=AckMode.NONE)
    t = c.receive(1)
    with pytest.raises(SettleNotAllowed):
        c.settle(t, "ack")
    (a,) = c.finish(t, ValueError("lost otherwise"))
    assert a.purpose == "dead-letter"
    assert c.republished(a.token, True) == []


def test_release_returns_unstarted_without_counting_failure():
    c = core()
    t = c.receive(1)
    (copy,) = c.shutdown.release(t)  # a copy keeps its attempt: a requeue would count one
    assert copy.purpose == "restamp" and copy.set_headers[H.ATTEMPT] == 1
    assert c.counters.snapshot()["returned"] == 1
    assert c.shutdown.release(c.receive(2), started=True) == [Nack(2, requeue=True)]


def test_retry_policy_validation():
    with pytest.raises(ValueError):
        Retry(max_attempts=0)
    with pytest.raises(ValueError):
        ListenerPolicy(name="x", queue="q", mode=AckMode.NONE, retry=Retry(max_attempts=2))
    assert Retry(
        max_attempts=5, initial_interval=1, multiplier=2, max_interval=3
    ).delay_tiers_ms() == [
        1000,
        2000,
        3000,
    ]


def test_consuming_a_dlq_has_no_dlq_of_its_own():
    assert ListenerPolicy(name="x", queue="orders.dlq").dead_letter_queue is None


def test_unresolvable_handler_annotation_is_a_clear_error():
    from ackkit import App

    app = App()
    ns: dict = {}
    exec(  # a handler whose annotation names a type only imported elsewhere
        "from __future__ import annotations\ndef h(d: NotImportedHere) -> None: ...", ns
    )
    with pytest.raises(TypeError, match="cannot resolve its annotations"):
        app.listener("q")(ns["h"])


def test_batch_partial_success_retries_the_unprocessed_tail():
    c = core(
        retry=Retry(max_attempts=2), prefetch=10, flush=FlushPolicy(max_pending=10, interval=1)
    )
    ts = [c.receive(t) for t in range(1, 5)]
    acts = c._fates.finish_batch(ts, 2)  # AckIndex(1): deliveries 0 and 1 done
    retries = [a for a in acts if isinstance(a, Republish)]
    assert [a.tag for a in retries] == [3, 4]
    assert all(a.purpose == "retry" and a.set_headers[H.ATTEMPT] == 2 for a in retries)
    assert c.drain() == [Ack(2, multiple=True)]


def test_batch_handler_raising_fails_every_delivery_with_its_error():
    c = core()
    ts = [c.receive(t) for t in range(1, 3)]
    acts = c._fates.finish_batch(ts, 0, ValueError("batch broke"), "tb")
    assert [a.set_headers[H.ERROR_MESSAGE] for a in acts] == ["batch broke"] * 2
