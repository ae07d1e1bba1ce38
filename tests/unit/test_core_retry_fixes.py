"""Regression tests for core fixes found by the retry / dead-letter integration tests."""

from __future__ import annotations

from typing import Any

import pytest

from ackkit import Retry, RetryStrategy
from ackkit._core import headers as H
from ackkit._core.actions import Republish
from ackkit._core.brokers import V3
from ackkit._core.listener import ListenerCore
from ackkit._core.policy import ListenerPolicy


def core(now: list[float] | None = None, **kw: Any) -> ListenerCore:
    kw.setdefault("name", "l")
    kw.setdefault("queue", "q")
    clock = now if now is not None else [0.0]
    c = ListenerCore(ListenerPolicy(**kw), wallclock=lambda: clock[0], broker=V3)
    c.channel_opened()
    return c


@pytest.mark.parametrize(
    "headers",
    [
        {H.ATTEMPT: "abc"},
        {H.ATTEMPT: -1},
        {H.ATTEMPT: 10**12},
        # Redelivered after a consumer loss with its attempts used up.
        {H.ATTEMPT: 6},
    ],
)
def test_verdict_from_receive_gets_the_delivery_as_source(headers: dict[str, Any]) -> None:
    """receive() decides before the runtime built its Delivery: the verdict's Republish
    must still carry it (it used to carry None, and the pika publisher crashed the
    connection on every redelivery of such a message: an endless reconnect loop)."""
    c = core(retry=Retry(max_attempts=5))
    t = c.receive(1, headers=headers)
    assert t.verdict is not None
    payload = object()
    t.attach(payload)
    assert t.payload is payload
    (act,) = t.verdict
    assert isinstance(act, Republish)
    assert act.source is payload
    assert act.routing_key == "q.dlq"


def test_attach_without_verdict_only_sets_payload() -> None:
    c = core()
    t = c.receive(1)
    t.attach("d")
    assert t.payload == "d" and t.verdict is None


def test_broker_retry_copy_drops_the_quorum_delivery_count() -> None:
    """A quorum queue's x-delivery-count belongs to the copy that was delivered; the
    republished copy is a new message. Copied along, it was counted again on top of
    ackkit-attempt (attempt 2 -> 4 after one crash redelivery)."""
    c = core(retry=Retry(max_attempts=5, initial_interval=0.2), queue_type="quorum")
    t = c.receive(1, redelivered=True, headers={H.X_DELIVERY_COUNT: 1})
    assert t.attempt == 2
    t.attach("d")
    (act,) = c.finish(t, ValueError("boom"))
    assert isinstance(act, Republish) and act.purpose == "retry"
    assert act.set_headers[H.ATTEMPT] == 3
    assert H.X_DELIVERY_COUNT in act.set_headers
    assert act.set_headers[H.X_DELIVERY_COUNT] is None  # None removes the header


def test_dead_letter_copy_drops_the_quorum_delivery_count() -> None:
    c = core(retry=Retry(max_attempts=2), queue_type="quorum")
    t = c.receive(1, redelivered=True, headers={H.ATTEMPT: 1, H.X_DELIVERY_COUNT: 1})
    (act,) = c.finish(t, ValueError("boom"))
    assert act.purpose == "dead-letter"  # type: ignore[union-attr]
    assert act.set_headers[H.X_DELIVERY_COUNT] is None  # type: ignore[union-attr]


def test_in_process_retries_keep_the_first_failure_time() -> None:
    """In-process retries carry no headers between attempts: the dead letter used to say
    first failure == last failure."""
    now = [1000.0]
    c = core(
        now,
        retry=Retry(max_attempts=3, initial_interval=0.1, strategy=RetryStrategy.IN_PROCESS),
    )
    t = c.receive(1)
    t.attach("d")
    c.finish(t, ValueError("1"))
    now[0] = 1001.0
    c.finish(t, ValueError("2"))
    now[0] = 1002.0
    (act,) = c.finish(t, ValueError("3"))
    assert isinstance(act, Republish) and act.purpose == "dead-letter"
    h = act.set_headers
    assert h[H.ATTEMPTS] == 3
    assert h[H.FIRST_FAILURE].startswith("1970-01-01T00:16:40.000")
    assert h[H.LAST_FAILURE].startswith("1970-01-01T00:16:42.000")


def test_broker_retry_keeps_first_failure_from_headers() -> None:
    c = core(retry=Retry(max_attempts=3))
    first = "2020-01-01T00:00:00.000+00:00"
    t = c.receive(1, headers={H.ATTEMPT: 3, H.FIRST_FAILURE: first})
    t.attach("d")
    (act,) = c.finish(t, ValueError("x"))
    assert act.set_headers[H.FIRST_FAILURE] == first  # type: ignore[union-attr]


@pytest.mark.parametrize("kind", [bytes, str])
def test_max_body_size_holds_for_bytes_and_str_handlers(kind: type) -> None:
    """A bytes handler used to get any body, whatever max_body_size said."""
    from ackkit import BadPayload, Delivery
    from ackkit._handler import Binding, Decoder

    def as_bytes(body: bytes) -> None:
        pass

    def as_text(body: str) -> None:
        pass

    b = Binding(as_bytes if kind is bytes else as_text, Decoder(max_body_size=10))
    c = core()

    class _Settler:
        def settle(self, *a: Any) -> None:
            pass

    ok = Delivery(b"x" * 10, None, c.receive(1), _Settler())
    assert b.args(ok) == ((b"x" * 10) if kind is bytes else "x" * 10,)
    big = Delivery(b"x" * 11, None, c.receive(2), _Settler())
    with pytest.raises(BadPayload, match="exceeds max_body_size=10"):
        b.args(big)


# -- dead-lettering cost: tracebacks formatted only for dead letters, once per failure --


def _raise_at_one_place(n: int) -> BaseException:
    try:
        raise ValueError(f"poison {n % 2}")
    except ValueError as exc:
        return exc


def test_dead_letter_formats_the_traceback_from_the_exception() -> None:
    c = core()
    t = c.receive(1)
    t.attach("d")
    (act,) = c.finish(t, _raise_at_one_place(0))  # no traceback text passed
    tb = act.set_headers[H.ERROR_TRACEBACK]  # type: ignore[union-attr]
    assert tb.startswith("Traceback (most recent call last):")
    assert "_raise_at_one_place" in tb and tb.rstrip().endswith("ValueError: poison 0")


def test_retry_does_not_format_a_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    import ackkit._core.copy_headers as L

    calls: list[BaseException] = []
    monkeypatch.setattr(L, "format_traceback", lambda e: calls.append(e) or "tb")
    c = core(retry=Retry(max_attempts=2))
    t = c.receive(1)
    t.attach("d")
    (act,) = c.finish(t, _raise_at_one_place(0))
    assert act.purpose == "retry" and calls == []  # type: ignore[union-attr]
    t = c.receive(2, headers={H.ATTEMPT: 2})
    t.attach("d")
    c.finish(t, _raise_at_one_place(0))
    assert len(calls) == 1


def test_format_traceback_is_the_standard_text_and_cached() -> None:
    import traceback

    from ackkit._core.tb import _CACHE, format_traceback

    a, b, other = _raise_at_one_place(0), _raise_at_one_place(0), _raise_at_one_place(1)
    text = format_traceback(a)
    assert text == "".join(traceback.format_exception(type(a), a, a.__traceback__))
    assert format_traceback(b) is text  # same place, same error: formatted once
    assert format_traceback(other) != text and "poison 1" in format_traceback(other)
    assert len(_CACHE) <= 256


def test_format_traceback_keeps_the_chain() -> None:
    from ackkit._core.tb import format_traceback

    try:
        try:
            raise KeyError("inner")
        except KeyError as e:
            raise RuntimeError("outer") from e
    except RuntimeError as exc:
        text = format_traceback(exc)
    assert "KeyError: 'inner'" in text and "direct cause" in text and "RuntimeError: outer" in text


def test_failure_log_is_throttled_and_counts_what_it_left_out(
    caplog: pytest.LogCaptureFixture,
) -> None:
    import logging

    from ackkit._logs import FailureLog

    now = [0.0]
    flog = FailureLog(logging.getLogger("ackkit.test"), burst=3, window=1.0, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="ackkit.test"):
        for _ in range(10):
            flog.failed("l", "<d>", ValueError("x"))
        now[0] = 1.5
        flog.failed("l", "<d>", ValueError("x"))
    lines = [r.getMessage() for r in caplog.records]
    # the first failure of its kind with its traceback (outside the throttle), then
    # `burst` plain lines, then one that counts what the window left out
    assert len(lines) == 5
    assert lines[0].startswith("l: handler failed on '<d>': ValueError: x\n")
    assert all("\n" not in line for line in lines[1:])
    assert lines[1] == "l: handler failed on '<d>': ValueError: x"
    assert lines[4].endswith("(6 more failures not logged)")


# -- a deleted DLQ / delay queue: declared again instead of a hot requeue loop ----------


def test_unroutable_dead_letter_declares_the_dlq_and_publishes_again() -> None:
    """The DLQ deleted while the app runs: every copy came back unroutable and the
    original was requeued, so a poison message looped through the handler (~1,000
    invocations a second on a local broker)."""
    from ackkit._core.actions import Ack, Reject

    c = core()
    t = c.receive(1)
    t.attach("d")
    (first,) = c.finish(t, ValueError("x"))
    assert isinstance(first, Republish) and first.declare is None
    (again,) = c.republished(first.token, False, unroutable=True)
    assert isinstance(again, Republish)
    assert again.token != first.token and again.routing_key == "q.dlq"
    assert again.declare == ("q.dlq", {})
    assert again.set_headers == first.set_headers and again.source == "d"
    assert c.republished(again.token, True) == [Ack(1)]  # acked at once after the confirm
    assert c.drain() == []

    t = c.receive(2)
    t.attach("d2")
    (first,) = c.finish(t, ValueError("x"))
    (again,) = c.republished(first.token, False, unroutable=True)
    # Declared and still unroutable: give the original back, once.
    assert c.republished(again.token, False, unroutable=True) == [Reject(2, requeue=True)]


def test_unroutable_retry_declares_the_delay_queue_with_its_ttl() -> None:
    c = core(retry=Retry(max_attempts=3, initial_interval=0.2))
    t = c.receive(1)
    t.attach("d")
    (first,) = c.finish(t, ValueError("x"))
    assert isinstance(first, Republish) and first.routing_key == "q.retry.200ms"
    (again,) = c.republished(first.token, False, unroutable=True)
    assert isinstance(again, Republish)
    assert again.declare == (
        "q.retry.200ms",
        {"x-message-ttl": 200, "x-dead-letter-exchange": "", "x-dead-letter-routing-key": "q"},
    )


def test_retry_later_delay_queue_is_declared_again_too() -> None:
    from ackkit import RetryLater
    from ackkit._core.actions import Reject

    c = core(retry=Retry(max_attempts=3, initial_interval=0.2))
    t = c.receive(1)
    t.attach("d")
    (first,) = c.finish(t, RetryLater(delay=0.7))
    assert isinstance(first, Republish) and first.declare is not None  # first use declares
    # Declared with this very publish and still unroutable: requeue.
    assert c.republished(first.token, False, unroutable=True) == [Reject(1, requeue=True)]
    t = c.receive(2)
    t.attach("d2")
    (second,) = c.finish(t, RetryLater(delay=0.7))
    assert isinstance(second, Republish) and second.declare is None
    (again,) = c.republished(second.token, False, unroutable=True)
    assert isinstance(again, Republish) and again.declare is not None
    assert again.declare[0] == "q.retry.700ms"
    assert again.declare[1]["x-message-ttl"] == 700


def test_refused_but_routable_copy_still_requeues() -> None:
    """A broker nack (e.g. a full DLQ with overflow reject-publish) is not fixed by
    declaring: the original is requeued as before."""
    from ackkit._core.actions import Reject

    c = core()
    t = c.receive(1)
    t.attach("d")
    (first,) = c.finish(t, ValueError("x"))
    assert c.republished(first.token, False) == [Reject(1, requeue=True)]


def test_redelivery_past_max_attempts_reports_the_attempts_made() -> None:
    """Killed in attempt 5 of 5: the redelivery is attempt 6 and never reaches the
    handler; the dead letter said ackkit-attempts 6 next to '5 of 5'."""
    c = core(retry=Retry(max_attempts=5))
    t = c.receive(1, redelivered=True, headers={H.ATTEMPT: 5})
    assert t.attempt == 6 and t.verdict is not None
    t.attach("d")
    (act,) = t.verdict
    assert isinstance(act, Republish)
    assert act.set_headers[H.REASON] == "attempts exhausted (5 of 5, last one lost)"
    assert act.set_headers[H.ATTEMPTS] == 5
