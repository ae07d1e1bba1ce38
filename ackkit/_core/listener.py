"""ListenerCore: every settlement decision for one listener, without I/O.

The core is the one entry point a runtime talks to; it holds the listener's
state and turns events into actions, with its parts in their own modules:

- `arrival.arrival`: what a delivery's arrival comes to (run it, or not);
- `fates.Fates`: how a delivery ends (finish, settle, ack, requeue, retry,
  dead-letter), `failure.decide` being the rule for a failure;
- `shutdown.Shutdown`: whether a handler may start, and stopping;
- `ledger.Ledger`: channel generations, the tag window and when acks go out;
- `copies`: what each retry, dead-letter and restamp copy carries (headers, properties);
- `topology.Queues`: the queues the listener needs (dead-letter queue, delay tiers);
- `republish.Confirms`: copies awaiting the broker's confirm, and what that settles;
- `gating.Gating`: the flow gate's answers (pause, breaker, rate limit, serial mode)
  as actions (`Consume`, `Run`) in `receive`, `begin`, `handled` and `tick`.

What stays here is the state and the lifecycle that ties them together.
"""

from __future__ import annotations

import dataclasses
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from . import headers as H
from . import outcome as _outcome
from .actions import Action, TxSelect
from .arrival import Arrival, arrival
from .brokers import UNKNOWN, BrokerTraits, CountSource
from .errors import BadPayload
from .events import Counters, Observer, Stage
from .fates import Fates
from .flow import NO_FLOW
from .gate import Flow
from .gating import Gating
from .ledger import Ledger
from .lost import LostRuns
from .outcome import Go, Outcome
from .policy import AckMode, ListenerPolicy
from .republish import MAX_LOST_COPIES, Confirms
from .shutdown import Shutdown
from .topology import Queues, QueueSpec, missing_queue
from .tracked import Tracked

__all__ = ["MAX_LOST_COPIES", "Go", "ListenerCore", "QueueSpec", "Tracked", "missing_queue"]


class ListenerCore(Fates, Shutdown, LostRuns, Queues, Gating):
    """Decisions for one listener on one channel at a time.

    A runtime calls: `channel_opened()` when its channel for this listener is
    open, `receive()` per delivery, `begin()` just before a handler runs,
    `handled()` (or `finish()`) when the handler returned or
    raised, `settle()` for handler-driven acks, `republished()` when a
    confirm for a Republish arrived, `tick()` periodically, `drain()` before
    cancel/close, `channel_closed()` when the channel is gone. Each returns
    actions to carry out in order on the current channel.
    """

    def __init__(
        self,
        policy: ListenerPolicy,
        *,
        clock: Callable[[], float] = time.monotonic,
        wallclock: Callable[[], float] = time.time,
        observer: Observer | None = None,
        shared_channel: bool = False,
        broker: BrokerTraits = UNKNOWN,
        hold_early_copies: bool = False,
        dedup: bool = False,
        gated: bool = False,
        declare_on_use: bool = False,
    ) -> None:
        self.policy = policy
        # Pull mode: the DLQ and delay queues are declared with the first copy sent to
        # each (`Republish.declare`), not up front: a get() declares nothing unasked.
        self.declare_on_use = declare_on_use
        # Other consumers take tags on this core's channel (pull mode: one channel, one
        # core per queue): a multiple frame never covers a tag this core did not receive.
        self.shared_channel = shared_channel
        self.mode = policy.mode
        self._wallclock = wallclock
        self.observer = observer
        # RECEIVED and ACKED happen once per healthy message: emitted only to observers
        # that want them (see Observer).
        self._hot = observer is not None and getattr(observer, "hot", True)
        self.counters = Counters()
        self.ledger = Ledger(
            policy.mode,
            policy.flush_policy,
            policy.prefetch,
            self.counters,
            clock,
            shared_channel,
        )
        # a consumer holds a restamp copy that overtakes its original's ack (see Confirms)
        self.confirms = Confirms(
            policy, self.ledger, self.counters, self._emit, hold=hold_early_copies
        )
        self._declared: set[str] = set()
        # an inbox listener: a redelivery whose key is recorded is a duplicate, never a
        # crash loop or an exhausted message (see `LostRuns.look_up_first`)
        self.init_lost_runs(clock, dedup)
        self.broker = UNKNOWN
        self._count = CountSource.REDELIVERED
        self.use_broker(broker)
        self.stopping = False
        """The app is stopping (`stop()`): no handler starts, no retry runs again."""
        self._returning: deque[Tracked] = deque()
        """Unstarted deliveries waiting for their turn to go back as a copy (`release`)."""
        self._given_back = False
        """The stop has no time left for copies (`give_back`): no more are sent."""
        # pause, circuit breaker, rate limit, per-key serial mode (see gate.Flow)
        self.flow = Flow(
            policy.flow or NO_FLOW,
            clock,
            self._flow_event,
            returnable=policy.mode is not AckMode.NONE,
        )
        self.confirms.flow = self.flow  # told of refused and accepted copies
        # The runtime holds a consumer of its own and carries out `Consume` and `Run`
        # (the App's and AsyncApp's consumers): `receive`, `begin` and `tick` ask the
        # gate. False (pull, Spark, a core on its own): deliveries are never held or
        # returned by it; `handled` still tells it how a call ended (see `gating`).
        self.gated = gated

    def use_broker(self, broker: BrokerTraits) -> None:
        """The connection reports this broker (called on every connect: a broker may
        have been upgraded meanwhile). Sets how attempts are counted."""
        self.broker = broker
        self._count = broker.count_source(self.policy.queue_type)
        self._count_header = self._count.header

    @property
    def count_source(self) -> CountSource:
        """Where previous deliveries of a copy are counted from, on this broker."""
        return self._count

    @property
    def generation(self) -> int:
        """The current channel's generation (one more per channel opened)."""
        return self.ledger.generation

    @property
    def open(self) -> bool:
        """Is the listener's channel open now?"""
        return self.ledger.open

    # -- channel lifecycle -----------------------------------------------

    def channel_opened(self) -> list[Action]:
        self.ledger.opened()
        return [TxSelect()] if self.mode is AckMode.TRANSACTED else []

    def consumer_cancelled(self) -> int:
        """The broker cancelled the listener's consumer (basic.cancel from the server).

        RabbitMQ 4.3 does this on a consumer timeout instead of closing the channel, and
        returns every delivery of the consumer to its queue; 4.3.6 keeps the consumer
        registered until the channel closes (an answer to its cancel would close the
        channel before 4.3.7). Decision: the old deliveries are fenced at once, like a
        closed channel's (their settles are dropped and counted, never sent), and the
        runtime closes this channel and consumes on a new one, where tags start afresh.
        Returns how many deliveries were outstanding.
        """
        self.counters.counts[Stage.CONSUMER_CANCELLED] += 1
        return self.channel_closed()

    def channel_closed(self) -> int:
        """The channel is gone: every outstanding delivery of it is now stale.

        Returns how many deliveries had not been acked; the broker has requeued them.
        Their handlers may still settle them: that is dropped (and counted) then.
        """
        self._free_slot()
        self.confirms.channel_closed()
        self._returning.clear()  # the broker requeued them
        if self.gated:
            self.flow.channel_gone()
        return self.ledger.closed()

    # -- deliveries -------------------------------------------------------

    def receive(
        self,
        tag: int,
        redelivered: bool = False,
        headers: Mapping[str, Any] | None = None,
        exchange: str = "",
        routing_key: str = "",
        message_id: str | None = None,
        unreadable: str | None = None,
        wire_headers: Mapping[str, Any] | None = None,
        properties: Any = None,
    ) -> Tracked:
        """Track a delivery. If `verdict` is set on the result, do not run the handler:
        carry out the verdict's actions instead. An empty verdict holds the delivery:
        a `Start` from `republished` starts it later, after a `Fence` (`take_held` at
        shutdown). A verdict may also start the delivery itself after a Fence (a
        restamp copy whose original's ack may still be unwritten; see `Confirms`).

        `unreadable`: the client library could not decode the delivery's properties
        (why, in words). Such a delivery never reaches a handler: it is dead-lettered
        (the copy carries its body, the properties the runtime could salvage, e.g. its
        message_id, and ackkit's reason), or rejected without requeue when the
        listener has no dead-letter queue, so the queue's own dead-letter route takes
        it whole.

        The flow gate has its say too (`admit`): a held delivery's verdict is empty (a
        `Run` queues it later), a returned one's is a `Consume` and its `Nack`.
        `properties`: the client library's, read for a `SerialKey.property`.

        `wire_headers`: the same headers as they were on the wire ({name: wire.Field}),
        when the runtime kept them: the attempt header is read from there, because a
        client library may have changed its type (pika reads a double as an int).
        """
        # a redelivery of one we returned unstarted (paused, tripped) is not an attempt
        back = self.flow.forgive(message_id) if redelivered and self.flow.owed else 0
        try:
            attempt = H.attempt_of(
                headers,
                redelivered,
                count_header=self._count_header,
                returned=back,
                wire=wire_headers,
            )
            bad: str | None = None
        except H.BadAttemptHeader as exc:
            attempt, bad = 1, str(exc)
        t = Tracked(tag, self.generation, attempt, headers, exchange, routing_key, message_id)
        flow = self.flow
        if flow.serial is not None and self.gated:
            t.key = flow.serial.of(headers, properties, routing_key)
        if self.charging is not None and headers and headers.get(H.RESTAMP_ID) == self.charging:
            self.charged_copy_back(t)
        self.counters.counts[Stage.RECEIVED] += 1
        if self._hot:
            self._emit(Stage.RECEIVED, t, "", count=False)
        mode = self.mode
        if mode is AckMode.NONE:
            t.settled = unreadable is None  # the broker settled it on send
        else:
            self.ledger.track(t)
        mx = self.policy.retry.max_attempts
        if unreadable is None and bad is None:
            if (self.confirms.held or self.confirms.fencing) and headers and not redelivered:
                held = self.confirms.hold_early(t, headers)
                if held is not None:  # []: `republished` starts it; or a fence, then it
                    t.verdict = held
                    return t
            if redelivered and mx <= 1 and mode is not AckMode.NONE and not back:
                lost = self.lost_run(t, headers, wire_headers)
                if lost is not None:
                    if t.verdict is None and flow.gated:
                        t.verdict = self.admit(t)
                    return t
            if mx <= 1 or (not redelivered and attempt <= mx):
                # The common case, where `arrival` says RUN: a first delivery with
                # attempts left (or no retries): only the flow gate, when on, decides.
                if flow.gated:
                    t.verdict = self.admit(t)
                return t
        verdict = arrival(
            mode=mode,
            unreadable=unreadable is not None,
            forged=bad is not None,
            attempt=attempt,
            max_attempts=mx,
            redelivered=redelivered and not back,  # not restamped: we know why it is back
            count=self._count,
        )
        if verdict is Arrival.UNREADABLE:
            t.verdict = self._unreadable(t, unreadable or "")
        elif verdict is Arrival.FORGED:
            t.verdict = self._dead_letter(t, bad or "", BadPayload(bad or ""), None)
        elif verdict is Arrival.EXHAUSTED:
            why = f"attempts exhausted ({attempt - 1} of {mx}, last one lost)"
            self.doom(t, why, attempt - 1)  # this delivery never reaches the handler
        elif verdict is Arrival.RESTAMP:
            t.verdict = [self._restamp(t)]
        elif t.verdict is None and flow.gated:
            t.verdict = self.admit(t)
        return t

    def handled(
        self,
        batch: Sequence[Tracked],
        result: object = None,
        exc: BaseException | None = None,
        *,
        is_batch: bool = False,
        undecodable: Sequence[tuple[Tracked, BaseException]] = (),
        traceback: str | None = None,
    ) -> Outcome:
        """A handler ran for `batch` (one delivery, or a batch) and returned `result` or
        raised `exc` (any exception, interpreter-exit signals included): what it comes
        to (see `outcome.handled`), with what the flow gate makes of it at the end of
        `Outcome.actions` (a `Consume`, returns, a `Run` for each delivery it lets through)."""
        out = _outcome.handled(
            self,
            batch,
            result,
            exc,
            is_batch=is_batch,
            undecodable=undecodable,
            traceback=traceback,
        )
        if not self.flow.active:
            return out
        more = self._flow_done([*batch, *(t for t, _ in undecodable)], exc, out.rerun)
        return dataclasses.replace(out, actions=[*out.actions, *more]) if more else out

    def interrupted(self, fact: _outcome.Interruption) -> bool:
        """A cancellation reached a running handler: True to release its deliveries
        (`release(t, started=True)`), False to report it to `handled` as a failure."""
        return _outcome.released(fact)

    def take_held(self) -> list[Tracked]:
        """Shutdown: deliveries held unstarted by `receive` or `start`, and those the flow
        gate holds (return them)."""
        waiting, self._waiting = self._waiting, []
        gate = self.flow.drain() if self.flow.active else []
        return gate + self.confirms.take_held() + waiting

    def duplicate(self, t: Tracked, key: str) -> None:
        """An inbox listener found `t`'s key recorded already: counted and told (the
        runtime then finishes it as done, without running the handler)."""
        self._emit(Stage.DUPLICATE, t, f"inbox key {key!r} already recorded")

    def current(self, generation: int) -> bool:
        """Do actions decided for channel generation `generation` still belong on the
        listener's channel (it is open and is that generation)? One rule for every
        executor (asked per action: kept to one call)."""
        led = self.ledger
        return generation == led.generation and led.open

    # -- copies awaiting the broker's confirm ------------------------------

    def publishable(self, token: int) -> bool:
        """May the copy a Republish asks for still be published (just before sending it)?

        Not when the original's channel has closed since the action was decided: the
        broker has requeued the original, which will be delivered and decided again,
        so a copy published now would be a duplicate (a second retry lineage, a second
        dead letter). Report such a token with `republished(token, ok=False)`.
        """
        return self.confirms.publishable(token)

    def republished(
        self,
        token: int,
        ok: bool,
        *,
        unroutable: bool = False,
        error: str | None = None,
        lost: str | None = None,
    ) -> list[Action]:
        """The broker confirmed (ok) or refused a Republish: settle the original.

        `unroutable`: the copy came back with basic.return (no queue bound): if
        the target is one of ackkit's own queues it is declared and the copy
        published once more. `error`: the copy could not be built or sent (the
        client library raised while encoding it; why, in words). `lost`: the channel
        it went out on closed before the broker answered (the close's reason, the
        broker's words: a 403 ACCESS_REFUSED is a refusal; anything else a chance).
        Neither: a basic.nack.

        A copy that failed is never retried forever and a copy the broker refused never
        costs its original (see `republish.Confirms._failed`): a lost copy is sent once
        more a few times, a refused one returns its original to its queue and makes the
        listener wait (FlowState.REFUSED), counted per message; only a copy that cannot
        even be built minimal rejects its original.
        """
        acts = self.confirms.confirmed(token, ok, unroutable, error, lost)
        if self._returning:  # a copy's slot is free: the next unstarted delivery's copy
            acts.extend(self._return_next())
        return acts

    # -- time and shutdown -------------------------------------------------

    def tick(self) -> list[Action]:
        """Call periodically (e.g. every 50 ms): sends acks held longer than the interval,
        and starts a redelivery that waited for the charge slot once it is free; the flow
        gate's wait for a breaker or a refusal ends (`Consume`)."""
        acts = self.ledger.tick()
        if self._waiting:
            acts.extend(self.start_waiting())
        if self.flow.ticking:
            acts.extend(self._flow_tick())
        return acts

    def drain(self) -> list[Action]:
        """Send every pending ack now (before basic.cancel and channel close)."""
        return self.ledger.drain()

    @property
    def pending_acks(self) -> int:
        return self.ledger.pending

    @property
    def outstanding(self) -> int:
        return self.ledger.outstanding()

    @property
    def republishing(self) -> int:
        return len(self.confirms)

    def unsettled(self) -> list[Tracked]:
        return self.ledger.unsettled()
