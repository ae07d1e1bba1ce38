"""What the headers of a retry or dead-letter copy say, without a broker: the
quorum delivery count left behind, the first failure time kept across attempts."""

from __future__ import annotations

from ackkit import Retry, RetryStrategy
from ackkit._core import headers as H
from ackkit._core.actions import Republish
from tests.unit._fakes import core


def test_broker_retry_copy_drops_the_quorum_delivery_count() -> None:
    """A quorum queue's x-delivery-count belongs to the copy that was delivered; the
    republished copy is a new message. Copied along, it was counted again on top of
    ackkit-attempt (attempt 2 -> 4 after one crash redelivery)."""
    c = core(retry=Retry(max_attempts=5, initial_interval=0.2), queue_type="quorum")
    t = c.receive(1, redelivered=True, headers={H.X_DELIVERY_COUNT: 1})
    assert t.attempt == 2
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
    (act,) = c.finish(t, ValueError("x"))
    assert act.set_headers[H.FIRST_FAILURE] == first  # type: ignore[union-attr]
