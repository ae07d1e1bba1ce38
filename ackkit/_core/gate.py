"""Flow: one listener's gate between "delivered" and "handler started" (no I/O).

It decides, for every delivery the runtime received, whether its handler may
start now, must wait (its key is busy; the breaker is probing with others), or
goes back to the queue (the listener is paused or tripped); how long a start
waits for the rate limit; and when the listener should hold a consumer at all.
`ListenerCore` (its `gating` part) turns each `FlowStep` into actions a runtime
carries out: a `Consume`, a `Nack` per returned delivery, a `Run` per ready one.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Collection, Hashable, Mapping, Sequence
from typing import Any

from .breaker import Breaker, BreakerState
from .events import Stage
from .flow import FlowPolicy, FlowState
from .flowstep import Admission, FlowStep
from .limiter import KeySerializer, TokenBucket
from .tracked import Tracked

MAX_OWED = 100_000
"""Most message ids remembered as returned unstarted."""

REFUSAL_WAIT = 1.0
"""Seconds a listener whose copies the broker refuses waits before it consumes again."""
MAX_REFUSAL_WAIT = 60.0
"""The longest such wait (it doubles while the broker goes on refusing)."""

_NOT_CONSUMING = (FlowState.PAUSED, FlowState.TRIPPED, FlowState.REFUSED)

Emit = Callable[[Stage, str], None]
"""Count a listener-level stage and tell the observers (reason in words)."""


__all__ = ["Admission", "Emit", "Flow", "FlowStep"]


class Flow:
    """Pause, circuit breaker, rate limit and per-key serial mode of one listener."""

    def __init__(
        self,
        policy: FlowPolicy,
        clock: Callable[[], float],
        emit: Emit,
        *,
        returnable: bool = True,
    ) -> None:
        self.policy = policy
        # False with AckMode.NONE: the broker forgot a delivery on send, so one that
        # arrived runs even while paused (there is no giving it back).
        self.returnable = returnable
        self.clock = clock
        self.emit = emit
        self.paused = False
        # Another consumer holds the queue exclusively (set by the listener's `Consuming`)
        self.standby = False
        self.breaker = Breaker(policy.breaker) if policy.breaker is not None else None
        self.bucket = TokenBucket(policy.rate_limit) if policy.rate_limit is not None else None
        self.serial = policy.serial_key
        self.keys: KeySerializer[Tracked] = KeySerializer()
        self.holding: dict[Tracked, Hashable | None] = {}  # admitted: the key each holds
        self.probes: set[Tracked] = set()  # half-open: the deliveries let through
        self.parked: deque[Tracked] = deque()  # half-open: arrived after the probes
        self.keyed: set[Tracked] = set()  # parked ones that hold their key already
        self.probes_started = 0
        self.running: set[Tracked] = set()  # begun (`started`) and holding their keys
        # message_id -> returns not counted yet (see `owe`), oldest first, bounded
        self.owed: dict[str, int] = {}
        # copies refused by the broker (see `copy_refused`): destination -> its reason
        self.refusing: dict[str, str] = {}
        self.blocked = False  # waiting out `refusal_wait` (FlowState.REFUSED)
        self.refusal_wait = 0.0
        self.blocked_until = 0.0
        self._step = FlowStep()  # decided off the tick (a refusal): carried out by `tick`
        self.gated = self.active
        """Does a delivery that arrives need `arrive` (else it would say RUN)?"""

    # -- state ----------------------------------------------------------------

    @property
    def state(self) -> FlowState:
        if self.paused:
            return FlowState.PAUSED
        if self.blocked:
            return FlowState.REFUSED
        b = self.breaker
        if b is None or b.state is BreakerState.CLOSED:
            return FlowState.STANDBY if self.standby else FlowState.CONSUMING
        return FlowState.TRIPPED if b.state is BreakerState.OPEN else FlowState.PROBING

    @property
    def consuming(self) -> bool:
        """Should the listener hold a consumer on its queue now (or, standing by, keep
        trying to)?"""
        return self.state in (FlowState.CONSUMING, FlowState.PROBING, FlowState.STANDBY)

    @property
    def active(self) -> bool:
        """Does the gate track handler calls (a breaker, or serial mode)?"""
        return self.breaker is not None or self.serial is not None

    def _regate(self) -> None:
        """Keep `gated` (read per delivery: an attribute, not a property) up to date."""
        self.gated = self.paused or self.blocked or self.active

    @property
    def ticking(self) -> bool:
        """Does `tick` have anything to do (a breaker, a refusal wait, a step to carry out)?"""
        step = self._step  # FlowStep's truth, inline: the tick asks this every period
        pending = step.returned or step.ready or step.consume is not None
        return self.breaker is not None or bool(self.refusing) or bool(pending)

    @property
    def waiting(self) -> int:
        """Deliveries held in the gate (key busy, or parked while probing)."""
        return len(self.keys) + len(self.parked)

    # -- deliveries -------------------------------------------------------------

    def arrive(self, t: Tracked, key: Hashable | None = None) -> Admission:
        """A delivery arrived (its key, from `SerialKey.of`, None without serial mode).
        One the gate let through before, and that the core held since (a redelivery
        waiting for the lost-run slot, then started), holds its key already: it runs."""
        if t in self.holding and t not in self.parked:
            return Admission.RUN
        state = self.state
        if state in _NOT_CONSUMING:
            if self.returnable:
                return Admission.RETURN
            state = FlowState.CONSUMING
        if state is FlowState.PROBING and self.probes_started >= self._probe_quota():
            self.parked.append(t)
            self.holding[t] = key
            return Admission.WAIT
        self.holding[t] = key
        if not self.keys.arrive(key, t):
            return Admission.WAIT
        if state is FlowState.PROBING:
            self.probes.add(t)
            self.probes_started += 1
        return Admission.RUN

    def may_start(self, t: Tracked) -> bool:
        """Just before its handler starts: may it? False: return it (`hold_back`)."""
        state = self.state
        if state is FlowState.CONSUMING or state is FlowState.STANDBY or not self.returnable:
            return True
        return state is FlowState.PROBING and t in self.probes

    def reserve(self, n: int = 1) -> float:
        """Seconds to wait before `n` handler starts (a batch of n) may begin; books them."""
        if self.bucket is None:
            return 0.0
        wait = self.bucket.reserve(n, self.clock())
        if wait > 0:
            self.emit(Stage.THROTTLED, f"rate limit: {n} start(s) wait {wait:.3f} s")
        return wait

    def key(self, headers: Mapping[str, Any] | None, properties: Any, routing_key: str) -> Any:
        """A delivery's serial key (None without serial mode, or when it has none)."""
        return None if self.serial is None else self.serial.of(headers, properties, routing_key)

    def failed(self, exc: BaseException | None) -> bool:
        """Does a call that raised `exc` count as a failure for the breaker?"""
        return self.breaker is not None and self.breaker.cfg.counts(exc)

    def done(
        self, ts: Sequence[Tracked], failed: bool | None, keep: Collection[Tracked] = ()
    ) -> FlowStep:
        """A handler call for `ts` ended: `failed` tells the breaker (None: it never ran,
        the deliveries went back unstarted). The keys of all but `keep` (they run again:
        an in-process retry) are freed for the next deliveries."""
        step = FlowStep()
        probing = any(t in self.probes for t in ts)
        for t in ts:
            if t not in keep:
                self._leave(t, step)
        b = self.breaker
        if failed is None or b is None or (b.state is BreakerState.HALF_OPEN and not probing):
            return self._admit_released(step)
        was = b.state
        if b.record(failed, self.clock()):
            self._trip(step, "a probe failed" if was is BreakerState.HALF_OPEN else self._why())
            return step
        if was is BreakerState.HALF_OPEN and b.state is BreakerState.CLOSED:
            self.probes.clear()
            self.emit(Stage.RECOVERED, f"{b.cfg.probes} probe(s) succeeded")
            parked = list(self.parked)
            self.parked.clear()
            for t in parked:
                if t in self.keyed:  # it holds its key already
                    self.keyed.discard(t)
                    step.ready.append(t)
                elif self.arrive(t, self.holding.pop(t, None)) is Admission.RUN:
                    step.ready.append(t)
        return self._admit_released(step)

    def drain(self) -> list[Tracked]:
        """Shutdown: every delivery waiting in the gate, taken out (return them)."""
        step = FlowStep()
        self._empty(step)
        return step.returned

    # -- by hand, and by time ------------------------------------------------------

    def pause(self, why: str = "paused by hand") -> FlowStep:
        if self.paused:
            return FlowStep()
        self.paused = True
        self._regate()
        self.emit(Stage.PAUSED, why)
        step = FlowStep(consume=False)
        if self.returnable:
            self._empty(step)
        return step

    def resume(self, why: str = "resumed by hand") -> FlowStep:
        if not self.paused:
            return FlowStep()
        self.paused = False
        self._regate()
        self.emit(Stage.RESUMED, f"{why} ({self.state.value})")
        return FlowStep(consume=self.consuming)

    def tick(self) -> FlowStep:
        """Call periodically (while `ticking`): carries out a refusal's pause, consumes
        again when a refusal's wait is over; a tripped breaker whose wait is over
        starts probing."""
        step, self._step = self._step, FlowStep()
        if self.blocked and self.clock() >= self.blocked_until:
            self.blocked = False
            self._regate()
            self.emit(Stage.RESUMED, f"consuming again to try once more: {self._refused_why()}")
            step.consume = self.consuming
        b = self.breaker
        if b is None or not b.poll(self.clock()):
            return step
        self.probes.clear()
        self.probes_started = 0
        self.emit(Stage.PROBING, f"probing with {b.cfg.probes} delivery(ies)")
        step.consume = self.consuming
        return step

    # -- copies the broker refuses ---------------------------------------------------

    def copy_refused(self, destination: str, why: str) -> None:
        """The broker refused a copy to queue `destination` (`why`: its words). The
        listener stops consuming for `refusal_wait` seconds (doubling while refusals go
        on); what waits in the gate goes back. Carried out by the next `tick`."""
        self.refusing[destination] = why
        if len(self.refusing) > 100:  # destinations are few; a bound all the same
            del self.refusing[next(iter(self.refusing))]
        if self.blocked:
            return
        wait = REFUSAL_WAIT if self.refusal_wait <= 0 else self.refusal_wait * 2
        self.refusal_wait = min(wait, MAX_REFUSAL_WAIT)
        self.blocked = True
        self._regate()
        self.blocked_until = self.clock() + self.refusal_wait
        self.emit(
            Stage.PAUSED,
            f"the broker refuses copies to {destination!r} ({why}); the messages go back to "
            f"their queue, consuming again in {self.refusal_wait:g} s",
        )
        self._step.consume = False
        if self.returnable:
            self._empty(self._step)

    def copy_accepted(self, destination: str) -> None:
        """The broker confirmed a copy to `destination`: it refuses no more."""
        if not self.refusing or self.refusing.pop(destination, None) is None:
            return
        if self.refusing:
            return  # another destination still refuses
        self.refusal_wait = 0.0
        if self.blocked:
            self.blocked = False
            self._regate()
            self._step.consume = self.consuming
        self.emit(Stage.RECOVERED, f"copies to {destination!r} accepted again")

    def _refused_why(self) -> str:
        return "; ".join(f"copies to {d!r} refused ({w})" for d, w in self.refusing.items())

    # -- returns that are not attempts --------------------------------------------

    def owe(self, message_id: str | None) -> None:
        """A delivery with `message_id` went back to the queue unstarted: its next
        redelivery is not an attempt. (Without a message_id a redelivery cannot be
        recognised, and counts as one.)"""
        if not message_id:
            return
        owed = self.owed
        owed[message_id] = owed.pop(message_id, 0) + 1
        if len(owed) > MAX_OWED:
            del owed[next(iter(owed))]

    def forgive(self, message_id: str | None) -> int:
        """A redelivery with `message_id` arrived: 1 if it is one we gave back (it is
        then not counted as an attempt), else 0."""
        if not message_id or message_id not in self.owed:
            return 0
        n = self.owed.pop(message_id) - 1
        if n:
            self.owed[message_id] = n
        return 1

    # -- internals ------------------------------------------------------------------

    def _probe_quota(self) -> int:
        b = self.breaker
        return b.cfg.probes if b is not None else 0

    def _why(self) -> str:
        b = self.breaker
        assert b is not None
        c = b.cfg
        return (
            f"failure ratio >= {c.failure_ratio:g} over {c.window:g} s "
            f"(at least {c.min_attempts} calls); consuming again in {c.open_for:g} s"
        )

    def _trip(self, step: FlowStep, why: str) -> None:
        self.probes.clear()
        self.emit(Stage.TRIPPED, why)
        step.consume = False
        self._empty(step)

    def _empty(self, step: FlowStep) -> None:
        """Not consuming any more: everything waiting in the gate, and whatever was about
        to start, goes back (their keys freed)."""
        waiting = self.keys.take_all()  # behind a busy key: they hold nothing
        holders = [*step.ready, *(t for t in self.parked if t in self.keyed)]
        unkeyed = [t for t in self.parked if t not in self.keyed]
        step.ready = []
        self.parked.clear()
        self.keyed.clear()
        for t in holders:
            self.keys.done(self.holding.pop(t, None))  # nothing waits behind it any more
        for t in (*waiting, *unkeyed):
            self.holding.pop(t, None)
        step.returned.extend([*holders, *waiting, *unkeyed])

    def started(self, ts: Sequence[Tracked]) -> None:
        """Handlers begin on `ts` (those holding a key keep it until `done`)."""
        holding = self.holding
        self.running.update(t for t in ts if t in holding)

    def channel_gone(self) -> None:
        """The channel closed: every delivery the gate knows is stale (the broker
        requeued it) and will never run, except those whose handlers run now. Only
        those keep their keys (their `done` passes each to the next delivery); the rest
        is forgotten, so the redeliveries on the next channel wait for nothing else."""
        keep = {t: self.holding[t] for t in self.running if t in self.holding}
        self.keys.waiting = {k: deque() for k in set(keep.values()) if k is not None}
        self.holding = keep
        self.running = set(keep)
        self.parked.clear()
        self.keyed.clear()
        self.probes &= self.running

    def _leave(self, t: Tracked, step: FlowStep) -> None:
        """`t` is done with (finished, or returned): free its key for the next one."""
        self.probes.discard(t)
        self.running.discard(t)
        if t not in self.holding:
            return
        nxt = self.keys.done(self.holding.pop(t))
        if nxt is not None:
            step.ready.append(nxt)

    def _admit_released(self, step: FlowStep) -> FlowStep:
        """Deliveries that took a freed key may only start if the state allows it now."""
        state = self.state
        if state in _NOT_CONSUMING and self.returnable:
            self._empty(step)
        elif state is FlowState.PROBING:
            keep = []
            for t in step.ready:
                if self.probes_started < self._probe_quota():
                    self.probes.add(t)
                    self.probes_started += 1
                    keep.append(t)
                else:  # it holds its key; it waits for the probes' verdict
                    self.parked.append(t)
                    self.keyed.add(t)
            step.ready = keep
        return step
