"""The flow gate's answers in the core's own protocol: actions, like every other answer.

`gate.Flow` decides pause, circuit breaker, rate limit and per-key serial mode;
this part of `ListenerCore` (`ListenerCore.gating`, handed the listener's
`parts.Parts`, the gate and whether its runtime carries out `Consume` and `Run`)
turns its `FlowStep`s into what a runtime already
carries out: a `Consume` (hold a consumer or not) first, then the `Nack` of
each delivery given back unstarted, then a `Run` for each delivery the gate let
through. A runtime never reads the gate's state: it asks

- `receive` (a delivery arrived): its `verdict` holds it in the gate (empty) or
  returns it (a `Consume` and its `Nack`); `admit` asks the same for a delivery
  the core held and now starts (`Start`);
- `begin` (a worker is about to run these; `shutdown.Shutdown.begin`, which asks
  `start` here when flow control is on): which run, after how long a wait for
  the rate limit, and what becomes of the others;
- `handled`, `tick`, `set_paused`, `withdraw`: the actions the gate adds (`done`,
  `tick` here for the first two).

Only a runtime that holds a consumer of its own and carries out `Consume` and
`Run` builds its core with `gated=True` (the App's and AsyncApp's consumers);
pull and Spark cores never hold or return a delivery.
"""

from __future__ import annotations

from collections.abc import Sequence

from .actions import Action, Consume, Nack, Run
from .events import Stage
from .gate import Admission, Flow, FlowStep
from .parts import Part, Parts
from .policy import AckMode
from .step import Step
from .tracked import Tracked


class Gating(Part):
    """The flow gate's part of a `ListenerCore`."""

    def __init__(self, parts: Parts, flow: Flow, *, gated: bool) -> None:
        super().__init__(parts)
        self.flow = flow
        """The gate itself: its `state` (and `paused`) for the runtime to read."""
        # The runtime holds a consumer of its own and carries out `Consume` and `Run`
        # (the App's and AsyncApp's consumers): `receive`, `begin` and `tick` ask the
        # gate. False (pull, Spark, a core on its own): deliveries are never held or
        # returned by it; `handled` still tells it how a call ended.
        self.gated = gated

    @property
    def consuming(self) -> bool:
        """Should the listener hold a consumer on its queue now (asked when a channel
        opens, and when a basic.consume was answered: a pause may have come meanwhile)?"""
        return self.flow.consuming

    def admit(self, t: Tracked) -> list[Action] | None:
        """`t` is about to be queued for a handler (from `receive`; or a delivery the
        core held, on its `Start`): None to queue it; otherwise carry out these actions
        instead (empty: the gate holds it, a later `Run` queues it)."""
        flow = self.flow
        if not self.gated or not flow.gated:
            return None
        how = flow.arrive(t, t.key)
        if how is Admission.RUN:
            return None
        if how is Admission.WAIT:
            return []
        return [Consume(False), *self.hold_back(t, flow.state.value)]

    def hold_back(self, t: Tracked, why: str) -> list[Action]:
        """Return a delivery unstarted because the listener stopped consuming (paused, a
        tripped breaker): requeued, and its redelivery is not counted as an attempt."""
        if t.settled or not self._ledger.current(t) or self.mode is AckMode.NONE:
            return []
        self._ledger.gone(t)
        self.flow.owe(t.message_id)
        self._emit(Stage.RETURNED, t, why)
        return [Nack(t.tag, requeue=True, counts=False)]

    def start(self, go: list[Tracked], acts: list[Action], waited: bool) -> Step:
        """`begin`'s part with flow control on: the rate limit's wait, then the deliveries
        the gate no longer lets start go back (their keys freed)."""
        flow = self.flow
        if flow.bucket is not None and not waited:
            wait = flow.reserve(len(go))
            if wait > 0:
                return Step(self._ledger.generation, acts, go, wait)
        if flow.gated:
            back = [t for t in go if not flow.may_start(t)]
            if back:
                go = [t for t in go if t not in back]
                acts.extend(self._give_back(back))
        return Step(self._ledger.generation, acts, go)

    def withdraw(self, ts: Sequence[Tracked]) -> tuple[list[Tracked], Step]:
        """The consumer was cancelled while `ts` waited for a handler: those that may
        still start stay queued (the first list); the others go back now rather than
        when a handler is free (the actions)."""
        back = [t for t in ts if not self.flow.may_start(t)]
        gen = self._ledger.generation
        if not back:
            return list(ts), Step(gen)
        keep = [t for t in ts if t not in back]
        return keep, Step(gen, self._give_back(back, consumer=False))

    def set_paused(
        self, paused: bool, why: str | None = None, returning: Sequence[Tracked] = ()
    ) -> Step:
        """Pause (by hand, or the inbox's database is down) or resume the listener.
        `returning`: deliveries whose handler call gave up (unstarted): they go back
        with what the pause returns."""
        flow = self.flow
        if not paused:
            return Step(
                self._ledger.generation, self._actions(flow.resume(why or "resumed by hand"))
            )
        step = flow.pause(why or "paused by hand")
        if returning:
            more = flow.done(returning, None) if flow.active else FlowStep()
            step.returned[:0] = returning
            step.returned.extend(more.returned)
        return Step(self._ledger.generation, self._actions(step))

    def tick(self) -> list[Action]:
        """The gate's periodic part (a breaker's wait, a refusal's pause and wait)."""
        if not self.gated or not self.flow.ticking:
            return []
        return self._actions(self.flow.tick())

    def done(
        self, ts: Sequence[Tracked], exc: BaseException | None, keep: Sequence[Tracked]
    ) -> list[Action]:
        """A handler call for `ts` ended (`keep`: they run again): the gate's actions."""
        flow = self.flow
        return self._actions(flow.done(ts, flow.failed(exc), keep)) if flow.active else []

    def leave(self, t: Tracked) -> list[Action]:
        """`t` will never run (its channel closed before its handler began, or it was
        settled meanwhile): the key it holds in the gate goes to the next delivery, or
        a redelivery on the new channel would wait behind it for ever."""
        if not self.gated or t not in self.flow.holding:
            return []
        return self._actions(self.flow.done([t], None), consumer=False)

    def take_held(self) -> list[Tracked]:
        """Shutdown: the deliveries the gate holds (they go back unstarted)."""
        return self.flow.drain() if self.flow.active else []

    def channel_closed(self) -> None:
        """The channel is gone: the gate forgets what it held of it."""
        if self.gated:
            self.flow.channel_gone()

    def _give_back(self, back: list[Tracked], *, consumer: bool = True) -> list[Action]:
        """`back` may not start: they go back unstarted, their keys freed."""
        step = self.flow.done(back, None)
        step.returned[:0] = back
        return self._actions(step, consumer=consumer)

    def _actions(self, step: FlowStep, *, consumer: bool = True) -> list[Action]:
        """A gate's step as actions, in the order they must go out: the consumer first
        (a return the broker saw before the cancel would come straight back), then the
        returns, then the deliveries it lets through. A delivery of a closed channel is
        not let through (the broker requeued it): its key is freed for the next one."""
        flow = self.flow
        acts: list[Action] = []
        if step.consume is not None:
            acts.append(Consume(step.consume))
        elif step.returned and consumer:
            acts.append(Consume(flow.consuming))
        if step.returned:
            why = flow.state.value
            for t in step.returned:
                acts.extend(self.hold_back(t, why))
        ready = list(step.ready)
        for _ in range(len(flow.holding) + len(ready) + 1):  # each round frees a key
            if not ready:
                break
            stale = [t for t in ready if not self._ledger.current(t)]
            acts.extend(Run(t.tag) for t in ready if self._ledger.current(t))
            if not stale:
                break
            more = flow.done(stale, None)
            for t in more.returned:
                acts.extend(self.hold_back(t, flow.state.value))
            ready = more.ready
        return acts
