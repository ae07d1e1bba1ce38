"""Carry out a listener's core actions on its pika channel, in the order decided.

Shared by the App's consumers, the Spark source and pull mode. Actions are decided
under the listener's lock, on any thread, and wait in `outbox` in decision order;
the I/O thread (the only one that may touch pika) takes them out oldest first
and carries them out on the channel of the generation they were decided for,
or drops them when that channel is gone: a delivery tag is channel-scoped, and
a stale one closes the new channel with PRECONDITION_FAILED.

A `Fence` makes the executor wait for the broker without blocking the I/O thread:
basic.qos (the listener's own prefetch, a no-op) goes out with a callback, and the
actions after the Fence, and the outbox behind them, wait until the broker's
basic.qos-ok arrives (`_passed`). pika's basic_ack only queues its frame; the qos-ok
says the broker has processed it. When the channel closes first, the callback never
comes: what waited is dropped with its generation.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

import pika.exceptions

from .._core.actions import Ack, Reject, Republish
from .._core.listener import ListenerCore
from .._core.step import Step
from .._interpreter.dispatch import Op, operations, settles, stale
from .._interpreter.originals import Originals


class IoThread(Protocol):
    """What an executor needs of the engine that owns its connection."""

    @property
    def connection(self) -> Any: ...

    def call_soon(self, fn: Callable[[], None], /) -> object: ...


class Executor:
    """One listener's side of its channel: the outbox of decided actions, the one rule
    for whether they may still be sent (`valid`), and what the core's tags are to it
    (`originals`). Subclasses say how a copy is published (`_publish`), what it is a
    copy of (`original`) and how a held delivery starts (`_start`)."""

    def __init__(self, name: str, core: ListenerCore, io: IoThread, log: logging.Logger) -> None:
        self.name = name
        self.core = core
        self.io = io
        self.log = log
        self.lock = threading.Lock()
        self.channel: Any = None
        # Decided steps wait here for the I/O thread, in decision order (see send()).
        self.outbox: deque[Step] = deque()
        self._flushing = False
        # the connection whose I/O loop has a flush pending for this outbox (`send`)
        self._woken: object = None
        # the actions after a Fence (of its step's generation) while its basic.qos-ok is
        # awaited
        self._fenced: Step | None = None
        # tag -> the runtime's object for the delivery; token -> the original of a copy
        self.originals: Originals[Any] = Originals()

    # -- any thread -------------------------------------------------------------

    def send(self, step: Step) -> None:
        """From any thread, holding `self.lock` right after the core decided `step`:
        queue it for the I/O thread.

        Frames must reach the channel in the order the core decided them: a straggler's
        single ack overtaken by a later multiple-ack that covers it would be an unknown
        delivery tag to the broker (it closes the channel), and a requeue overtaken by
        such an ack would ack a message that was meant to go back to the queue.
        """
        self.originals.decided(step.generation, step.actions)
        self.outbox.append(step)
        # One wake-up of the I/O thread for the steps decided until it flushes (a flush
        # takes the whole outbox): none while one is pending on this connection's loop.
        conn = self.io.connection
        if self._woken is not conn or conn is None:
            self._woken = conn if self.io.call_soon(self.flush) else None

    def queue(self, step: Step) -> None:
        """Holding `self.lock` right after the core decided `step`: into the outbox (the
        caller flushes it, or has the I/O thread do it)."""
        self.originals.decided(step.generation, step.actions)
        self.outbox.append(step)

    # -- I/O thread -------------------------------------------------------------

    def decide(self, ask: Callable[[], Step]) -> None:
        """Ask the core (under the lock) and carry out what it decides, in order."""
        with self.lock:
            step = ask()
            if step.actions:
                self.queue(step)
        self.flush()

    def republished(
        self, gen: int, token: int, ok: bool, unroutable: bool = False, lost: str | None = None
    ) -> None:
        """The broker confirmed (ok) or refused a copy, or (`lost`: why) its channel closed
        before the broker answered: the core decides what now."""
        self.decide(lambda: self.core.republished(token, ok, unroutable=unroutable, lost=lost))
        with self.lock:
            self.originals.answered(token)

    def republish_failed(self, token: int, why: str) -> None:
        """The copy could not be sent at all: the core decides what now."""
        self.decide(lambda: self.core.republished(token, False, error=why))
        with self.lock:
            self.originals.answered(token)

    def flush(self) -> None:
        """Carry out the queued actions, oldest first."""
        self._woken = None  # a step decided from now on wakes the loop again
        if self._flushing:
            return  # called from inside execute(): the running loop picks them up
        self._flushing = True
        try:
            while True:
                if self._fenced is not None:
                    if self.valid(self._fenced.generation):
                        return  # the broker's answer to the fence resumes (`_passed`)
                    self._fenced = None  # its channel is gone, and the answer with it
                with self.lock:
                    if not self.outbox:
                        return
                    step = self.outbox.popleft()
                self.execute(step)
        finally:
            self._flushing = False

    def valid(self, gen: int) -> bool:
        """May actions decided for channel generation `gen` be sent now? Only on that
        channel, open, on an open connection (one going down closes its channels next:
        their tags are stale)."""
        ch = self.channel
        conn = self.io.connection
        return (
            ch is not None
            and ch.is_open
            and conn is not None
            and conn.is_open
            and self.core.current(gen)
        )

    def execute(self, step: Step) -> None:
        """Carry out `step`'s actions on the channel of its generation, or drop them
        (the one dispatch: `ackkit._interpreter.dispatch`)."""
        if not self.valid(step.generation):
            self._drop(step)
            return
        ch = self.channel
        by_outcome = getattr(ch, "settle", None)  # AMQP 1.0: the outcome the core's rule gives
        try:
            for _, op, x in operations(step, self.originals):
                if op is Op.SETTLE:
                    t = type(x)
                    if by_outcome is not None:
                        by_outcome(x)
                    elif t is Ack:
                        ch.basic_ack(x.tag, x.multiple)
                    elif t is Reject:
                        ch.basic_reject(x.tag, x.requeue)
                    else:
                        ch.basic_nack(x.tag, x.multiple, x.requeue)
                elif op is Op.PUBLISH:
                    self._publish(step.generation, x)
                elif op is Op.RUN:
                    self._run_ready(x)
                elif op is Op.START:
                    self._start(x)
                elif op is Op.CONSUME:
                    self._switch_consumer(x)
                elif op is Op.FENCE:
                    self._fence(ch, x)
                elif op is Op.TX_COMMIT:
                    ch.tx_commit()
                elif op is Op.TX_SELECT:
                    ch.tx_select()
        except (pika.exceptions.ChannelWrongStateError, pika.exceptions.ConnectionWrongStateError):
            # Closed under us: the broker requeues what was not settled; the close
            # callback that follows marks the generation stale.
            self.log.info("%s: channel closed while settling", self.name)

    def _drop(self, step: Step) -> None:
        """`step`'s channel is gone: its copies are forgotten (never sent, never
        answered), its Runs still go to a worker (see `dispatch.stale`)."""
        with self.lock:
            runs, tokens = stale(step, self.originals)
            for token in tokens:
                self.originals.answered(token)
        for d in runs:
            self._run_ready(d)
        if settles(step):
            self.log.info(
                "%s: dropped %d settle actions for a closed channel", self.name, len(step)
            )

    def _fence(self, ch: Any, rest: Step) -> None:
        """Carry out `rest` once the broker has answered a round trip sent after every
        frame before it on `ch` (see `Fence`); the outbox waits meanwhile (`flush`)."""
        self._fenced = rest
        try:
            # Asynchronous: pika calls back from its I/O loop when basic.qos-ok arrives.
            ch.basic_qos(
                prefetch_count=self.core.policy.prefetch, callback=lambda _f: self._passed(ch)
            )
        except BaseException:
            self._fenced = None
            raise

    def _passed(self, ch: Any) -> None:
        """basic.qos-ok of a fence on `ch`: what waited for it goes on."""
        fenced = self._fenced
        if fenced is None or ch is not self.channel:
            return
        self._fenced = None
        self.execute(fenced)  # checks that its generation is still the channel's
        self.flush()

    # -- what subclasses say ------------------------------------------------------

    def _publish(self, gen: int, a: Republish) -> None:
        """Hand the copy `a` to the confirm publisher."""
        raise NotImplementedError

    def original(self, a: Republish) -> tuple[Any, bytes]:
        """(pika properties, body) of the delivery `a` is a copy of (remembered in
        `originals` when the copy was decided; a `Delivery` there unless overridden)."""
        d = self.originals.copy(a.token)
        if d is None:  # never expected: a copy is decided while its delivery is mapped
            raise LookupError(f"the original of copy {a.token} is not remembered")
        return d.properties, d.body

    def _start(self, held: Any) -> None:
        """Start the handler of `held` (the runtime's object for a delivery the core held:
        cores built with `hold_early_copies=True` only)."""
        raise NotImplementedError

    def _switch_consumer(self, on: bool) -> None:
        """Hold a consumer on the queue (`on`) or cancel it (a gated core's `Consume`)."""
        raise NotImplementedError

    def _run_ready(self, d: Any) -> None:
        """Queue `d` for a handler: the flow gate let it through (a gated core's `Run`)."""
        raise NotImplementedError
