"""The ledger of one listener: which deliveries are outstanding on which channel, and
when their acks go out.

Delivery tags are channel-scoped: each channel the listener opens is a new
*generation*, and a delivery of an older one must never be settled on the
current channel (a stale tag closes it with PRECONDITION_FAILED). Within a
generation the `TagWindow` keeps every tag's state; an ack is held until a
flush rule sends it, as one multiple-ack over the contiguous settled prefix
where it can:

- by count: once `FlushPolicy.max_pending` acks are pending;
- by time: `tick()` once the oldest pending ack waited `FlushPolicy.interval`;
- always: `drain()` before cancel / close, and `ack_now()` for an original whose
  copy was confirmed (until its ack is out, a lost connection leaves both).

Acks behind a delivery still in flight ("stragglers") can only go out one by
one; a flush sends them when forced or when too many are pending. In
AckMode.TRANSACTED every flush ends with tx.commit.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from .actions import Ack, Action, Nack, TxCommit
from .events import Counters, Stage
from .policy import AckMode, FlushPolicy
from .step import Step
from .tracked import Tracked
from .window import TagWindow


class Ledger:
    """Outstanding deliveries of the current channel generation, and their pending acks."""

    __slots__ = (
        "_clock",
        "_counters",
        "_flush",
        "_last_flush",
        "_prefetch",
        "_shared",
        "_tracked",
        "generation",
        "idle",
        "mode",
        "open",
        "parked",
        "window",
    )

    def __init__(
        self,
        mode: AckMode,
        flush: FlushPolicy,
        prefetch: int,
        counters: Counters,
        clock: Callable[[], float],
        shared_channel: bool = False,
    ) -> None:
        self.mode = mode
        self._shared = shared_channel
        """Other cores' deliveries share the channel (pull mode): see TagWindow(shared)."""
        self._prefetch = prefetch
        self._flush = flush
        self._counters = counters
        self._clock = clock
        self.generation = 0
        self.idle = Step(0)
        """The empty step of the current generation (nothing to carry out, shared)."""
        self.open = False
        self.window = TagWindow(shared_channel)
        self._tracked: dict[int, Tracked] = {}
        self.parked = 0
        """CLIENT mode: deliveries whose handler returned without settling them."""
        self._last_flush = clock()

    # -- generations --------------------------------------------------------

    def opened(self) -> None:
        """A new channel: a new generation, nothing outstanding on it yet."""
        self.generation += 1
        self.idle = Step(self.generation)
        self.open = True
        self._reset()
        self._last_flush = self._clock()

    def closed(self) -> int:
        """The channel is gone; returns how many of its deliveries were outstanding (the
        broker has requeued them)."""
        self.open = False
        n = len(self._tracked)
        self._reset()
        return n

    def _reset(self) -> None:
        self.window = TagWindow(self._shared)
        self._tracked = {}
        self.parked = 0

    def current(self, t: Tracked) -> bool:
        """Was `t` delivered on the channel that is open now (may its tag be sent)?"""
        return t.generation == self.generation and self.open

    # -- deliveries -----------------------------------------------------------

    def track(self, t: Tracked) -> None:
        self.window.add(t.tag)
        self._tracked[t.tag] = t

    def take(self, t: Tracked) -> Tracked:
        """`t` is settled (decided): no longer outstanding for the handler's side."""
        t.settled = True
        self._tracked.pop(t.tag, None)
        if t.parked:
            t.parked = False
            self.parked -= 1
        return t

    def untake(self, t: Tracked) -> None:
        """`t`, taken for a copy the broker then refused, is outstanding again (its handler
        runs after all)."""
        t.settled = False
        self._tracked[t.tag] = t

    def take_upto(self, tag: int) -> list[Tracked]:
        """Take every delivery in flight with a tag up to `tag` (a multiple settle)."""
        out = []
        for x in self.window.in_flight_upto(tag):
            y = self._tracked.get(x)
            if y is not None:
                out.append(self.take(y))
        return out

    def gone(self, t: Tracked) -> None:
        """Take `t`, settled at the broker by a frame of its own (reject, nack)."""
        self.take(t)
        self.window.mark_gone(t.tag)

    def park(self, t: Tracked) -> list[Tracked]:
        """CLIENT mode: `t` returned unsettled (a later multiple ack may settle it).
        Returns every parked delivery once they fill the prefetch window (0: no limit),
        else nothing."""
        if not t.parked:
            t.parked = True
            self.parked += 1
        if self._prefetch and self.parked >= self._prefetch:
            return [x for x in self._tracked.values() if x.parked]
        return []

    def outstanding(self) -> int:
        return len(self._tracked)

    def unsettled(self) -> list[Tracked]:
        return [t for t in self._tracked.values() if not t.settled]

    # -- acks -----------------------------------------------------------------

    @property
    def pending(self) -> int:
        return self.window.pending

    def ack(self, t: Tracked) -> list[Action]:
        """Settle `t` as acked; its ack goes out with the next flush (now, by count)."""
        self.take(t)
        w = self.window
        w.mark_ack(t.tag)
        if w.pending >= self._flush.max_pending:
            return self.flush(force=False)
        return []

    def ack_each(
        self, ts: Sequence[Tracked], stale: Callable[[Tracked], list[Action]]
    ) -> tuple[list[Action], int]:
        """`ack(t)` for each unsettled delivery of `ts` on the current channel, in order;
        one of a closed channel goes to `stale` (whose actions are kept in order).
        Returns the actions and how many were acked (the caller counts them)."""
        acts: list[Action] = []
        n = 0
        w = self.window
        gen, is_open, most = self.generation, self.open, self._flush.max_pending
        tracked = self._tracked
        for t in ts:
            if t.settled:
                continue
            if t.generation != gen or not is_open:
                acts.extend(stale(t))
                continue
            t.settled = True  # `take`, inlined: called once per delivery of a batch
            tracked.pop(t.tag, None)
            if t.parked:
                t.parked = False
                self.parked -= 1
            w.mark_ack(t.tag)
            n += 1
            if w.pending >= most:
                acts.extend(self.flush(force=False))
        return acts, n

    def ack_upto(self, tag: int) -> list[Tracked]:
        """Settle every delivery in flight up to `tag` as acked (a multiple ack); returns
        them. Their acks go out with `flush_by_count()`."""
        taken = self.take_upto(tag)
        for x in taken:
            self.window.mark_ack(x.tag)
        return taken

    def flush_by_count(self) -> list[Action]:
        return self.flush(force=self.window.pending >= self._flush.max_pending)

    def ack_now(self, t: Tracked) -> list[Action]:
        """Ack `t` at once, not with the next batch: its copy is confirmed, and until
        this ack reaches the broker a lost connection leaves both (a duplicate)."""
        self.take(t)
        w = self.window
        w.mark_ack(t.tag)
        top, n = w.take_prefix()
        acts: list[Action] = []
        if n:
            acts.append(Ack(top, multiple=n > 1))
            self._counters.ack_frame(n)
        if top < t.tag:  # an earlier delivery is still in flight: this one alone
            w.mark_gone(t.tag)
            acts.append(Ack(t.tag))
            self._counters.ack_frame(1)
        return acts

    def flush(self, force: bool) -> list[Action]:
        """Send the settled prefix as one ack; stragglers too when `force`d or too many."""
        w = self.window
        self._last_flush = self._clock()
        top, n = w.take_prefix()
        acts: list[Action] = []
        if n:
            acts.append(Ack(top, multiple=n > 1))
            self._counters.ack_frame(n)
        if w.pending and (force or w.pending >= self._flush.max_pending):
            for s in w.take_stragglers():
                acts.append(Ack(s))
                self._counters.ack_frame(1)
        if acts and self.mode is AckMode.TRANSACTED:
            acts.append(TxCommit())
        return acts

    def requeue_pending(self) -> list[Action]:
        """A transaction rolled back: its pending acks become requeues (counted so).

        basic.nack, not basic.reject: these handlers succeeded, so on RabbitMQ 4.3+ the
        requeue does not count toward a quorum queue's delivery-limit."""
        acts: list[Action] = []
        counts = self._counters.counts
        for tag in self.window.take_stragglers():
            acts.append(Nack(tag, requeue=True, counts=False))
            counts[Stage.ACKED] -= 1
            counts[Stage.REQUEUED] += 1
        return acts

    def tick(self) -> list[Action]:
        """Send acks held longer than the flush interval."""
        if not self.window.pending:
            self._last_flush = self._clock()
            return []
        if self._clock() - self._last_flush >= self._flush.interval:
            return self.flush(force=True)
        return []

    def drain(self) -> list[Action]:
        """Send every pending ack now (before basic.cancel and channel close)."""
        if not self.open:
            return []
        return self.flush(force=True)
