"""When RabbitMQ cannot convert a message for AMQP 1.0: the rule that gets past it.

RabbitMQ 4.x converts a message published over AMQP 0-9-1 when it delivers it over
AMQP 1.0. Some messages it cannot convert (seen on 4.3: a decimal header, a timestamp
header past 2**63 ms, some generated field types): the session process fails as it
delivers, and the broker ends the whole connection with `amqp:internal-error`
("Session error: function_clause ... mc_amqpl ..."). Every unsettled delivery of that
connection goes back to the head of its queue, the message that could not be
converted just behind them, so a consumer that only connects again meets it again:
forever on a classic queue, until the delivery limit on a quorum queue.

The rule: after such an end, the next connection takes the head of each queue that
was being consumed over AMQP 0-9-1 (a basic.get for each, settled on that channel),
as many messages as can have been ahead of the one that failed plus that one, and
hands them to the listener as any delivery. What cannot be read over AMQP 1.0 is read
over 0-9-1 (where it was published), handled, retried or dead-lettered as on that
protocol's runtime; the listener consumes over AMQP 1.0 again after it. A message
taken so that was not the culprit is handled all the same: no message is judged by
the guess. The failed conversion marks the message redelivered, but no handler saw it:
that is not an attempt (`redelivered`).
"""

from __future__ import annotations

UNCONVERTIBLE = "amqp:internal-error"
"""The error condition RabbitMQ ends an AMQP 1.0 connection with when a session fails
(a message it could not convert is the one cause seen)."""

FORCED = "Connection forced"
"""How RabbitMQ begins the description of the same condition when it closes a
connection on purpose (an operator's close_connection, a node shutting down)."""


def unconvertible(condition: str | None, description: str | None = None) -> bool:
    """Whether a connection the broker ended with `condition` (an AMQP 1.0 error
    condition's name) and `description` may have ended on a message it could not
    convert: an internal error that is not a forced close. (The description of a
    failed session names the conversion in an Erlang stack trace, and echoes the
    message's own bytes in some: it is not read further.)"""
    if condition != UNCONVERTIBLE:
        return False
    return not (description or "").startswith(FORCED)


def taken_over_091(prefetch: int, unsettled: int) -> int:
    """How many messages of a queue the next connection takes over AMQP 0-9-1, for a
    consumer that had `unsettled` deliveries unsettled when its connection ended: the
    broker sends a message only within the consumer's credit (`prefetch`), so the one
    it could not convert was at most the prefetch-th outstanding (with no prefetch,
    just behind the unsettled ones)."""
    if prefetch > 0:
        return max(prefetch, unsettled + 1)
    return unsettled + 1


def redelivered(index: int, delivered: int, flag: bool) -> bool:
    """Whether the `index`-th message (from 0) taken over AMQP 0-9-1 counts as
    redelivered, its basic.get-ok saying `flag`: the first `delivered` (the consumer's
    unsettled deliveries when the connection ended) went back to the queue's head in
    their order and were delivered, so their flag stands; the broker also sets it on
    the message it failed to convert, which no handler saw, so from there it does not
    count (a message redelivered before that connection loses one attempt of its count,
    never gains one)."""
    return flag and index < delivered
