"""One handler invocation, as both runtimes' attempt loops see it.

An `Invocation` knows which deliveries a handler call covers (one, or a
batch), builds the call's arguments from the listener's `Binding`, and asks
the listener's core what the call came to (`ListenerCore.handled`). It makes
no decision of its own: decoding failures of a batch's members are handed to
the core with the rest, and so is whatever the handler returned or raised.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .._core.listener import ListenerCore, Tracked
from .._core.step import Step
from .._messages.delivery import DeliveryBase
from .handler import Binding

_NONE: list[Any] = []
"""The undecodable deliveries of a single-delivery call: none (never appended to)."""


class Invocation:
    """The deliveries one handler call covers, and how to call it.

    A single delivery's body is decoded inside the call (`args()`), so a
    BadPayload is that call's failure. A batch is decoded up front: members
    whose body cannot be decoded leave it (`undecodable`) and are dead-lettered
    with their reason; the handler gets the rest.
    """

    __slots__ = ("_args", "binding", "deliveries", "undecodable")

    def __init__(self, binding: Binding, deliveries: Sequence[DeliveryBase]) -> None:
        self.binding = binding
        self.undecodable: list[tuple[DeliveryBase, BaseException]] = _NONE
        self._args: tuple[Any, ...] | None = None
        if not binding.batch:
            self.deliveries = deliveries if type(deliveries) is list else list(deliveries)
            return
        self.undecodable = []
        good: list[DeliveryBase] = []
        values: list[Any] = []
        for d in deliveries:
            try:
                values.append(binding.arg(d))
            except Exception as e:  # BadPayload, or a decoder that broke on this body
                self.undecodable.append((d, e))
            else:
                good.append(d)
        self.deliveries = good
        self._args = (values, good) if binding.pass_delivery else (values,)

    def args(self) -> tuple[Any, ...]:
        """Positional arguments for the handler; raises BadPayload for an undecodable body."""
        if self._args is not None:
            return self._args
        b = self.binding
        if not b.pass_delivery and b.kind != "none":  # the body's value alone
            return (b.arg(self.deliveries[0]),)
        return b.args(self.deliveries[0])

    def args_of(self, indexes: Sequence[int]) -> tuple[Any, ...]:
        """A batch handler's arguments for only `indexes` of `deliveries` (an inbox batch
        leaves its duplicates and twins out): nothing decoded again."""
        assert self._args is not None
        values, rest = self._args[0], self._args[1:]
        picked = [values[i] for i in indexes]
        if not rest:
            return (picked,)
        return (picked, [self.deliveries[i] for i in indexes])

    def narrow(
        self, settled: Sequence[int], failures: Sequence[tuple[DeliveryBase, BaseException]]
    ) -> None:
        """Keep only `settled` (indexes of `deliveries`, in the order the core settles
        them) for `outcome`, and fail `failures` with their own errors; the deliveries
        left out are settled elsewhere (an inbox batch's duplicates)."""
        ds = self.deliveries
        self.deliveries = [ds[i] for i in settled]
        if failures:
            self.undecodable = [*self.undecodable, *failures]

    def outcome(
        self,
        core: ListenerCore,
        result: object,
        exc: BaseException | None,
        traceback: str | None = None,
    ) -> Step:
        """What the call came to, decided by the core (call with the core's lock held)."""
        if not self.binding.batch:  # one delivery (the hot path: no lists to build)
            return core.handled((self.deliveries[0]._tracked,), result, exc, traceback=traceback)
        return core.handled(
            [d._tracked for d in self.deliveries],
            result,
            exc,
            is_batch=self.binding.batch,
            undecodable=[(d._tracked, e) for d, e in self.undecodable],
            traceback=traceback,
        )

    def again(self, rerun: Sequence[Tracked]) -> Invocation:
        """The invocation that runs the handler again for `rerun` (in-process retry)."""
        keep = {id(t) for t in rerun}
        return Invocation(self.binding, [d for d in self.deliveries if id(d._tracked) in keep])

    # FailureLog reads these to describe a failed call.
    @property
    def queue(self) -> str:
        return self.deliveries[0].queue if self.deliveries else ""

    @property
    def message_id(self) -> str | None:
        return self.deliveries[0].message_id if len(self.deliveries) == 1 else None

    @property
    def attempt(self) -> int:
        return max((d.attempt for d in self.deliveries), default=0)

    def __repr__(self) -> str:
        if len(self.deliveries) == 1 and not self.binding.batch:
            return repr(self.deliveries[0])
        return f"<batch of {len(self.deliveries)} deliveries>"


# -- instrumentation hooks (metrics, tracing) ---------------------------------

HandlerDone = Callable[[BaseException | None], None]
"""Called when a handler invocation has ended: None when it returned, else what it raised."""

HandlerProbe = Callable[[Sequence[DeliveryBase]], HandlerDone]
"""Called just before a handler runs for these deliveries (one, or a batch), on the
thread or task that runs it; the HandlerDone it returns is called there when the
handler has returned or raised. Runtimes call a listener's probe only when it has
one (`AppBase._instrument`), so an uninstrumented app pays nothing."""
