"""ListenerCore: every settlement decision for one listener, without I/O.

The core is the one entry point a runtime talks to. It is composed, as h11's
`Connection` holds its `ConnectionState`: it holds its parts as objects, each
built here and handed what it uses (the deciding ones the shared `parts.Parts`:
the policy, the clocks, the report, ledger, confirms and requeues; and the other
parts they work with), none reaching into another's state:

- `report.Report`: the counters, and the events the observer wants;
- `ledger.Ledger`: channel generations, the tag window and when acks go out;
- `republish.Confirms`: copies awaiting the broker's confirm, and what that settles
  (what each copy carries is `copies`');
- `gate.Flow`: pause, circuit breaker, rate limit and serial mode, decided;
- `topology.Queues`: the queues the listener needs (dead-letter queue, delay tiers),
  and which of them a copy declares first;
- `fates.Fates`: how a delivery ends (finish, settle, ack, requeue, retry,
  dead-letter), `failure.decide` being the rule for a failure;
- `requeues.Requeues` and `lost.LostRuns`: the explicit requeues of this process,
  and what bounds a crash loop when attempts do not;
- `gating.Gating`: the flow gate's answers as actions (`Consume`, `Run`);
- `shutdown.Shutdown`: whether a handler may start, and stopping.

What stays here is the lifecycle that ties them together: a delivery's arrival
(`receive`, `arrival.arrival` being the rule), a handler's end (`handled`), the
channel's life and the clock's ticks. A runtime reaches four parts by name, each
a surface of its own: `queues` (declaring), `gating` (the flow gate), `shutdown`
(the stop sequence) and `lost` (an inbox's duplicates).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from . import headers as H
from . import outcome as _outcome
from .actions import TxSelect
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
from .parts import Parts
from .policy import AckMode, ListenerPolicy
from .report import Report
from .republish import MAX_LOST_COPIES, Confirms
from .requeues import Requeues
from .shutdown import Shutdown
from .step import Step
from .topology import Queues, QueueSpec, missing_queue
from .tracked import Tracked

__all__ = [
    "MAX_LOST_COPIES",
    "Gauges",
    "ListenerCore",
    "QueueSpec",
    "Step",
    "Tracked",
    "missing_queue",
]


@dataclass(frozen=True, slots=True)
class Gauges:
    """How much a listener holds now (for metrics)."""

    outstanding: int
    """Deliveries received and not settled yet."""
    pending_acks: int
    """Settled, their ack frame not sent yet."""
    republishing: int
    """Retry, dead-letter and restamp copies awaiting the broker's confirm."""


class ListenerCore:
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
        self._mode = mode = policy.mode
        self.counters = Counters()
        self._report = report = Report(policy.name, self.counters, observer)
        # Other consumers take tags on this core's channel (pull mode: one channel, one
        # core per queue): a multiple frame never covers a tag this core did not receive.
        self._ledger = ledger = Ledger(
            mode, policy.flush_policy, policy.prefetch, self.counters, clock, shared_channel
        )
        # a consumer holds a restamp copy that overtakes its original's ack (see Confirms)
        self._confirms = confirms = Confirms(
            policy, ledger, self.counters, report.emit, hold=hold_early_copies
        )
        # pause, circuit breaker, rate limit, per-key serial mode (see gate.Flow)
        self._flow = flow = Flow(
            policy.flow or NO_FLOW,
            clock,
            report.listener_event,
            returnable=mode is not AckMode.NONE,
        )
        confirms.flow = flow  # told of refused and accepted copies
        self.queues = Queues(policy, confirms, broker, declare_on_use=declare_on_use)
        """The queues the listener needs, and their arguments on this broker."""
        parts = Parts(policy, report, ledger, confirms, Requeues(policy), clock, wallclock)
        self._fates = fates = Fates(parts, self.queues)
        # an inbox listener: a redelivery whose key is recorded is a duplicate, never a
        # crash loop or an exhausted message (see `LostRuns.look_up_first`)
        self.lost = LostRuns(parts, fates, dedup)
        """Lost handler runs (an inbox's runtime asks `look_up_first`, `duplicate`)."""
        # The runtime holds a consumer of its own and carries out `Consume` and `Run`
        # (`gated`: the App's and AsyncApp's consumers); see `gating`.
        self.gating = Gating(parts, flow, gated=gated)
        """The flow gate (`consuming`, `set_paused`, `withdraw`, `admit`, its `flow`)."""
        self.shutdown = Shutdown(parts, fates, self.lost, self.gating)
        """Starting handlers, and the stop sequence (`stop`, `give_back`, `quiescent`)."""
        self._count = CountSource.REDELIVERED
        self.use_broker(broker)

    def use_broker(self, broker: BrokerTraits) -> None:
        """The connection reports this broker (called on every connect: a broker may
        have been upgraded meanwhile). Sets how attempts are counted."""
        self.queues.use(broker)
        self._count = broker.count_source(self.policy.queue_type)
        self._count_header = self._count.header
        self.shutdown.returns_free = self._count is CountSource.TRANSFER

    @property
    def generation(self) -> int:
        """The current channel's generation (one more per channel opened)."""
        return self._ledger.generation

    @property
    def open(self) -> bool:
        """Is the listener's channel open now?"""
        return self._ledger.open

    # -- channel lifecycle -----------------------------------------------

    def channel_opened(self) -> Step:
        """The listener's channel is open: a new generation (its first frames, if any)."""
        self._ledger.opened()
        return Step(
            self._ledger.generation, [TxSelect()] if self._mode is AckMode.TRANSACTED else None
        )

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
        self.lost.channel_closed()
        self._confirms.channel_closed()
        self.shutdown.channel_closed()  # the broker requeued them
        self.gating.channel_closed()
        return self._ledger.closed()

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
        count: int | None = None,
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

        `count`: the protocol's own count of this copy's previous deliveries (AMQP 1.0's
        header delivery-count), read when the listener counts that way
        (`CountSource.TRANSFER`); its headers' counts are not read then.
        """
        # a redelivery of one we returned unstarted (paused, tripped) is not an attempt
        flow = self._flow
        back = flow.forgive(message_id) if redelivered and flow.owed else 0
        try:
            attempt = H.attempt_of(
                headers,
                redelivered,
                count_header=self._count_header,
                returned=back,
                wire=wire_headers,
                count=count if self._count is CountSource.TRANSFER else None,
            )
            bad: str | None = None
        except H.BadAttemptHeader as exc:
            attempt, bad = 1, str(exc)
        ledger = self._ledger
        t = Tracked(tag, ledger.generation, attempt, headers, exchange, routing_key, message_id)
        gating, lost, fates = self.gating, self.lost, self._fates
        if flow.serial is not None and gating.gated:
            t.key = flow.serial.of(headers, properties, routing_key)
        if lost.charging is not None:
            lost.arrived(t, headers)
        report = self._report
        report.counters.counts[Stage.RECEIVED] += 1
        if report.hot:
            report.emit(Stage.RECEIVED, t, "", count=False)
        mode = self._mode
        if mode is AckMode.NONE:
            t.settled = unreadable is None  # the broker settled it on send
        else:
            ledger.track(t)
        mx = self.policy.retry.max_attempts
        if unreadable is None and bad is None:
            confirms = self._confirms
            if (confirms.held or confirms.fencing) and headers and not redelivered:
                held = confirms.hold_early(t, headers)
                if held is not None:  # []: `republished` starts it; or a fence, then it
                    t.verdict = held
                    return t
            suspect = redelivered and mx <= 1 and mode is not AckMode.NONE and not back
            if suspect and lost.lost_run(t, headers, wire_headers) is not None:
                if t.verdict is None and flow.gated:
                    t.verdict = gating.admit(t)
                return t
            if mx <= 1 or (not redelivered and attempt <= mx):
                # The common case, where `arrival` says RUN: a first delivery with
                # attempts left (or no retries): only the flow gate, when on, decides.
                if flow.gated:
                    t.verdict = gating.admit(t)
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
            t.verdict = fates.unreadable(t, unreadable or "")
        elif verdict is Arrival.FORGED:
            t.verdict = fates.dead_letter(t, bad or "", BadPayload(bad or ""), None)
        elif verdict is Arrival.EXHAUSTED:
            why = f"attempts exhausted ({attempt - 1} of {mx}, last one lost)"
            lost.doom(t, why, attempt - 1)  # this delivery never reaches the handler
        elif verdict is Arrival.RESTAMP:
            t.verdict = [fates.restamp(t)]
        elif t.verdict is None and flow.gated:
            t.verdict = gating.admit(t)
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
    ) -> Step:
        """A handler ran for `batch` (one delivery, or a batch) and returned `result` or
        raised `exc` (any exception, interpreter-exit signals included): what it comes
        to (see `outcome.handled`), with what the flow gate makes of it at the end of
        `Step.actions` (a `Consume`, returns, a `Run` for each delivery it lets through)."""
        out = _outcome.handled(
            self._ledger.idle,
            self._fates,
            self.shutdown,
            batch,
            result,
            exc,
            is_batch=is_batch,
            undecodable=undecodable,
            traceback=traceback,
        )
        flow = self._flow
        if flow.breaker is None and flow.serial is None:  # `Flow.active`, inline
            return out
        return out.then(self.gating.done([*batch, *(t for t, _ in undecodable)], exc, out.run))

    def current(self, generation: int) -> bool:
        """Do actions decided for channel generation `generation` still belong on the
        listener's channel (it is open and is that generation)? One rule for every
        executor (asked per action: kept to one call)."""
        led = self._ledger
        return generation == led.generation and led.open

    def begin(self, ts: Sequence[Tracked], *, waited: bool = False) -> Step:
        """A worker is about to run the handler for `ts`: which of them run (`Step.run`),
        after how long a wait for the rate limit (`Step.delay`), and the actions for the
        others (see `Shutdown.begin`)."""
        return self.shutdown.begin(ts, waited=waited)

    def resume(self, rerun: Sequence[Tracked]) -> Step:
        """The wait before running a handler again for `rerun` (in-process retry) is over,
        or was cut short because the app stops: which of them run again now
        (`Step.run`), and the actions for the others (released when stopping)."""
        return self.shutdown.resume(rerun)

    def finish(
        self, t: Tracked, exc: BaseException | None = None, traceback: str | None = None
    ) -> Step:
        """The handler for `t` returned (exc None) or raised `exc` (see `Fates.finish`)."""
        return Step(self._ledger.generation, self._fates.finish(t, exc, traceback))

    def finish_all(self, ts: Sequence[Tracked]) -> Step:
        """`finish(t)` for each of `ts` in order, each a success (see `Fates.finish_all`)."""
        return Step(self._ledger.generation, self._fates.finish_all(ts))

    def settle(
        self, t: Tracked, kind: str, *, requeue: bool = False, multiple: bool = False
    ) -> Step:
        """The handler settles `t` itself: kind is a SettleKind ('ack', 'nack' or 'reject')."""
        acts = self._fates.settle(t, kind, requeue=requeue, multiple=multiple)
        return Step(self._ledger.generation, acts)

    # -- copies awaiting the broker's confirm ------------------------------

    def publishable(self, token: int) -> bool:
        """May the copy a Republish asks for still be published (just before sending it)?

        Not when the original's channel has closed since the action was decided: the
        broker has requeued the original, which will be delivered and decided again,
        so a copy published now would be a duplicate (a second retry lineage, a second
        dead letter). Report such a token with `republished(token, ok=False)`.
        """
        return self._confirms.publishable(token)

    def republished(
        self,
        token: int,
        ok: bool,
        *,
        unroutable: bool = False,
        error: str | None = None,
        lost: str | None = None,
    ) -> Step:
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
        acts = self._confirms.confirmed(token, ok, unroutable, error, lost)
        # a copy's slot is free: the next unstarted delivery's copy
        acts.extend(self.shutdown.return_next())
        return Step(self._ledger.generation, acts)

    # -- time and shutdown -------------------------------------------------

    def tick(self) -> Step:
        """Call periodically (e.g. every 50 ms): sends acks held longer than the interval,
        and starts a redelivery that waited for the charge slot once it is free; the flow
        gate's wait for a breaker or a refusal ends (`Consume`)."""
        acts = self._ledger.tick()
        if not self.shutdown.stopping:
            acts.extend(self.lost.start_waiting())
        if self._flow.ticking:
            acts.extend(self.gating.tick())
        return Step(self._ledger.generation, acts)

    def drain(self) -> Step:
        """Send every pending ack now (before basic.cancel and channel close)."""
        return Step(self._ledger.generation, self._ledger.drain())

    def gauges(self) -> Gauges:
        """How much the listener holds now (deliveries, acks, copies), for metrics."""
        led = self._ledger
        return Gauges(led.outstanding(), led.pending, len(self._confirms))
