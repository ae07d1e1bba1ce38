"""Step: the core's one answer to a runtime.

Every entry of the core a runtime calls (a delivery's start and end, a settle, a
confirm, a tick, a drain, a pause, the stop) answers with a `Step`: the channel
generation it was decided for, the actions to carry out on that channel in order, and,
where the entry is about running a handler, what runs next (`run`, after `delay`
seconds) and whether the app must stop (`stop`). A runtime asks one question of a
step, in one place (`ackkit._interpreter`): is its generation still the channel's?
If not, its actions are dropped: a delivery tag is channel-scoped.

A step reads as the sequence of its actions (`len`, iteration, indexing, truth), and
compares equal to a list or tuple of the same actions, so `step == [Ack(1)]` says what
it carries out.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, overload

from .actions import Action

if TYPE_CHECKING:
    from .tracked import Tracked

_NO_RUN: tuple[Tracked, ...] = ()


class Step(Sequence[Action]):
    """What the core decided, for the channel of one generation. Immutable."""

    __slots__ = ("actions", "delay", "generation", "run", "stop")

    actions: list[Action]
    """Carry these out now, in order, on the channel of `generation` (or not at all)."""
    generation: int
    """The listener's channel generation the actions were decided for."""
    run: tuple[Tracked, ...]
    """Run the handler for these (one delivery, or a batch) once `delay` is over: a
    worker's go-ahead (`begin`), or an in-process retry (`handled`, `resume`)."""
    delay: float
    """Seconds to wait first, on something the app's stop cuts short (the rate limit, a
    retry's backoff); then ask again (`begin(run, waited=True)`, `resume(run)`)."""
    stop: BaseException | None
    """The handler raised an interpreter-exit signal: stop the app with it (after the
    actions are carried out)."""

    def __init__(
        self,
        generation: int,
        actions: list[Action] | None = None,
        run: Sequence[Tracked] = _NO_RUN,
        delay: float = 0.0,
        stop: BaseException | None = None,
    ) -> None:
        setattr_ = object.__setattr__
        setattr_(self, "generation", generation)
        setattr_(self, "actions", [] if actions is None else actions)
        setattr_(self, "run", run if type(run) is tuple else tuple(run))
        setattr_(self, "delay", delay)
        setattr_(self, "stop", stop)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"a Step is immutable: cannot set {name}")

    # -- the sequence of its actions -------------------------------------------------

    def __len__(self) -> int:
        return len(self.actions)

    def __bool__(self) -> bool:
        return bool(self.actions)

    def __iter__(self) -> Iterator[Action]:
        return iter(self.actions)

    @overload
    def __getitem__(self, i: int) -> Action: ...
    @overload
    def __getitem__(self, i: slice) -> list[Action]: ...
    def __getitem__(self, i: int | slice) -> Action | list[Action]:
        return self.actions[i]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Step):
            return (
                self.generation == other.generation
                and self.actions == other.actions
                and self.run == other.run
                and self.delay == other.delay
                and self.stop is other.stop
            )
        if isinstance(other, list | tuple):
            return self.actions == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __add__(self, other: Sequence[Action]) -> list[Action]:
        """The actions of this step, then those of `other` (a list: what two decisions
        made one after the other carry out)."""
        return [*self.actions, *other]

    def __radd__(self, other: Sequence[Action]) -> list[Action]:
        return [*other, *self.actions]

    def __repr__(self) -> str:
        more = ""
        if self.run:
            more += f", run={[t.tag for t in self.run]}"
        if self.delay:
            more += f", delay={self.delay}"
        if self.stop is not None:
            more += f", stop={self.stop!r}"
        return f"Step(generation={self.generation}, {self.actions!r}{more})"

    def then(self, more: list[Action]) -> Step:
        """This step with `more` actions after its own (decided at the same time)."""
        if not more:
            return self
        return Step(self.generation, [*self.actions, *more], self.run, self.delay, self.stop)
