"""The outbox relay's held exchanges (`ackkit._core.outbox`): which failure says an
exchange does not exist, as each client words it, and the backoff before its rows are
tried again."""

from __future__ import annotations

import pika.exceptions

from ackkit._core.outbox import Holds, missing_exchange
from ackkit.errors import PublishNotConfirmed


def test_each_clients_words_for_a_missing_exchange_name_it() -> None:
    pika_app = PublishNotConfirmed(
        "publish to exchange 'orders' with routing key 'k' not confirmed: the connection or "
        "channel closed before the broker confirmed it: ChannelClosedByBroker: (404, "
        "\"NOT_FOUND - no exchange 'orders' in vhost '/'\")"
    )
    aio = PublishNotConfirmed(
        "publish to exchange 'it's' with routing key 'k' not confirmed: the channel closed "
        "first: ChannelNotFoundEntity: NOT_FOUND - no exchange 'it's' in vhost 'shop'"
    )
    assert missing_exchange(pika_app) == "orders"
    pulled = pika.exceptions.ChannelClosedByBroker(404, "NOT_FOUND - no exchange 'o' in vhost '/'")
    assert missing_exchange(pulled) == "o"  # pull mode (`ackkit outbox relay`): pika's own
    assert missing_exchange(aio) == "it's"
    try:
        try:
            raise KeyError("NOT_FOUND - no exchange 'deep' in vhost '/'")
        except KeyError as inner:
            raise RuntimeError("wrapped") from inner
    except RuntimeError as outer:
        assert missing_exchange(outer) == "deep"


def test_other_failures_are_not_a_missing_exchange() -> None:
    assert missing_exchange(PublishNotConfirmed("no confirm within 10 s")) is None
    assert missing_exchange(RuntimeError("NOT_FOUND - no queue 'q' in vhost '/'")) is None


def test_rows_to_a_missing_exchange_wait_longer_each_time_until_one_is_sent() -> None:
    h = Holds()
    assert h.missing("x", 100.0) == 1.0
    assert h.waiting(100.5) == ["x"] and h.waiting(101.0) == []
    assert [h.missing("x", 200.0) for _ in range(8)] == [2, 4, 8, 16, 32, 60, 60, 60]
    h.missing("y", 200.0)
    assert h.waiting(200.5) == ["x", "y"]
    h.sent("x")
    assert h.waiting(200.5) == ["y"]
    assert h.missing("x", 300.0) == 1.0  # it existed meanwhile: from the start again
