"""What a failed delivery becomes: one pure rule from (policy, attempt, exception).

A handler that raised hands its exception to the core. Whether that means
"back to the queue", "dead-letter it", "run the handler again in a moment" or
"republish it to a delay queue" depends only on the exception, the listener's
policy and the attempt the delivery is at. `decide` is that rule, returned as
a `Failure` value; `ListenerCore` turns it into actions and bookkeeping.

In order:

1. AckMode.NONE: the broker forgot the message on send; a dead letter is the
   only net left (LOST when the listener has no dead-letter queue).
2. RequeueMessage: back to its queue now (counts as an attempt).
3. RejectMessage, DeadLetterMessage: dead-lettered with the handler's reason.
4. BadPayload: dead-lettered, never retried.
5. Neither a RetryLater nor an exception the policy retries: dead-lettered.
6. Attempts used up (attempt >= max_attempts): dead-lettered.
7. Otherwise retried: in process after the backoff (or the RetryLater's
   delay), through the delay queue of that delay, or (QUORUM_DELAYED) rejected
   back to a quorum queue that holds it for its own linear delay.

A dead letter on a listener without a dead-letter queue is a reject without
requeue (REJECT): the queue's own dead-letter exchange takes it, if it has one.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from enum import Enum

from .errors import BadPayload, DeadLetterMessage, RejectMessage, RequeueMessage, RetryLater
from .policy import AckMode, ListenerPolicy, RetryStrategy
from .tb import describe, qualname
from .topology import round_delay_ms

MAX_RETRY_DELAY = 24 * 3600.0
"""The longest a RetryLater(delay=...) may ask for (seconds); longer asks are capped."""


class Fate(str, Enum):
    """What a failed delivery becomes."""

    REQUEUE = "requeue"
    """basic.reject with requeue: back on its queue now."""
    REJECT = "reject"
    """basic.reject without requeue (no dead-letter queue of ackkit's): the queue's own
    dead-letter exchange takes it, or the broker drops it."""
    DEAD_LETTER = "dead_letter"
    """A copy to the listener's dead-letter queue with the reason, then the original acked."""
    RETRY_IN_PROCESS = "retry_in_process"
    """Run the handler again after `Failure.delay` seconds; the delivery stays unacked."""
    RETRY_BROKER = "retry_broker"
    """A copy to the delay queue of `Failure.delay_ms`, then the original acked."""
    RETRY_QUORUM = "retry_quorum"
    """basic.reject with requeue to a quorum queue that delays it (RabbitMQ 4.3's native
    delayed retry, RetryStrategy.QUORUM_DELAYED): the queue holds it `Failure.delay`."""
    LOST = "lost"
    """AckMode.NONE without a dead-letter queue: nothing is left to settle; reported only."""

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True, slots=True)
class Failure:
    """The decision for one failed delivery."""

    fate: Fate
    reason: str = ""
    """Why, in words: the dead letter's ackkit-reason, or the event's reason."""
    delay: float = 0.0
    """RETRY_IN_PROCESS: seconds before the handler runs again."""
    delay_ms: int = 0
    """RETRY_BROKER: the delay queue's TTL."""
    asked: bool = False
    """RETRY_*: the delay is the one a RetryLater asked for, not the policy's backoff (a
    broker retry may then need a delay queue that is not one of the tiers)."""


def exhausted(attempt: int, max_attempts: int) -> str:
    """The reason of a delivery whose last allowed attempt failed. An attempt past the
    maximum ran because an earlier outcome (a retry or dead-letter copy, a settle) never
    reached the broker, under an alarm or a cut, and the message came back: the reason
    says so, rather than reading "(2 of 1)"."""
    if attempt <= max_attempts:
        return f"attempts exhausted ({attempt} of {max_attempts})"
    extra = attempt - max_attempts
    return (
        f"attempts exhausted ({attempt} of {max_attempts}: {extra} more after "
        f"{'an outcome' if extra == 1 else 'outcomes'} that did not reach the broker)"
    )


def asked_delay(exc: BaseException) -> float | None:
    """The delay a RetryLater asks for, made sane: None (use the policy's backoff) when
    it is not a real number, 0 when negative, at most MAX_RETRY_DELAY."""
    if not isinstance(exc, RetryLater):
        return None
    d = exc.delay
    if isinstance(d, bool) or not isinstance(d, (int, float)):
        return None
    d = float(d)
    if math.isnan(d):
        return None
    return min(max(d, 0.0), MAX_RETRY_DELAY)


def decide(
    policy: ListenerPolicy,
    attempt: int,
    exc: BaseException,
    rnd: random.Random | None = None,
) -> Failure:
    """What a delivery at `attempt` (1-based) whose handler raised `exc` becomes.

    `rnd` draws the backoff's jitter of an in-process retry (the module's random
    by default); nothing else here is random.
    """
    dead = Fate.DEAD_LETTER if policy.dead_letter_queue is not None else Fate.REJECT
    if policy.mode is AckMode.NONE:
        if policy.dead_letter_queue is None:
            return Failure(Fate.LOST, f"lost (no-ack, no DLQ): {describe(exc, qualified=True)}")
        return Failure(Fate.DEAD_LETTER, f"handler failed: {describe(exc, qualified=True)}")
    if isinstance(exc, RequeueMessage):
        return Failure(Fate.REQUEUE, exc.reason)
    if isinstance(exc, (RejectMessage, DeadLetterMessage)):
        return Failure(dead, exc.reason)
    if isinstance(exc, BadPayload):
        return Failure(dead, f"bad payload: {exc}")
    retry = policy.retry
    if not (isinstance(exc, RetryLater) or retry.should_retry(exc)):
        return Failure(dead, f"non-retryable {qualname(exc)}")
    if attempt >= retry.max_attempts:
        return Failure(dead, exhausted(attempt, retry.max_attempts))
    asked = asked_delay(exc)
    why = describe(exc)
    if retry.strategy is RetryStrategy.IN_PROCESS:
        delay = asked if asked is not None else retry.jittered(attempt, rnd)
        return Failure(Fate.RETRY_IN_PROCESS, why, delay=delay, asked=asked is not None)
    if retry.strategy is RetryStrategy.QUORUM_DELAYED:
        # The queue computes the delay; over AMQP 0-9-1 a message cannot carry its own.
        if asked is not None:
            why = f"{why} (the queue's delay applies, not the {asked:g} s asked for)"
        return Failure(Fate.RETRY_QUORUM, why, delay=retry.delay(attempt))
    # Broker delays come in fixed TTL tiers (one delay queue each); jitter does not apply.
    ms = retry.tier_for(attempt) if asked is None else round_delay_ms(asked)
    return Failure(Fate.RETRY_BROKER, why, delay_ms=ms, asked=asked is not None)
