"""The rule for a message RabbitMQ cannot convert for AMQP 1.0 (`ackkit._core.conversion`),
without a broker: which connection ends it covers, how many messages the next connection
takes over AMQP 0-9-1, and which of them count as redelivered."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from ackkit._core.conversion import redelivered, taken_over_091, unconvertible


def test_only_an_internal_error_that_is_not_a_forced_close_is_a_failed_conversion() -> None:
    failed = "Session error: function_clause\n[{mc_amqpl,from_091,[decimal,{1,15}],..."
    assert unconvertible("amqp:internal-error", failed)
    assert unconvertible("amqp:internal-error", None)  # its text unreadable: still one
    for forced in ('Connection forced: "chaos: connection cut"', "Connection forced: shutdown"):
        assert not unconvertible("amqp:internal-error", forced)  # what RabbitMQ 4.3 sends
    for name in (None, "amqp:connection:forced", "amqp:not-found", "amqp:resource-limit-exceeded"):
        assert not unconvertible(name, failed)


@given(prefetch=st.integers(0, 10_000), unsettled=st.integers(0, 10_000))
def test_the_culprit_is_among_the_messages_taken(prefetch: int, unsettled: int) -> None:
    """The broker delivers within the credit, so when it failed to convert the next
    message, `unsettled` were outstanding and the culprit was just behind them, all of
    them back at the queue's head in order: taking n reaches it."""
    if prefetch:
        unsettled = min(unsettled, prefetch - 1)  # credit left for the one it tried
    n = taken_over_091(prefetch, unsettled)
    assert n >= unsettled + 1
    if prefetch:
        assert n == prefetch  # never more than one window of the queue
    else:
        assert n == unsettled + 1


@given(delivered=st.integers(0, 100), flags=st.lists(st.booleans(), max_size=120))
def test_the_failed_conversion_is_not_an_attempt(delivered: int, flags: list[bool]) -> None:
    got = [redelivered(i, delivered, f) for i, f in enumerate(flags)]
    # the ones delivered on the connection that ended keep the broker's flag
    assert got[:delivered] == flags[:delivered]
    # from the culprit on, no handler saw them there: never counted
    assert not any(got[delivered:])
