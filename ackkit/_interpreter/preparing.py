"""Carrying out a topology preparation (`ackkit._core.exchanges.preparation`), for any
client.

The core lists what a connection declares, in order: queues that must exist, the
exchanges, the listeners' queues, ackkit's own, the bindings. Two kinds of step depend
on an answer from the broker (does this queue exist?), and every refusal becomes a
`TopologyConflict` worded by the step it refused. `declarations` turns the plan into
the broker operations to make, asking for existence checks as it goes; a runtime makes
each one with its client (blocking or awaited) and words a refusal with `refused`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from .._core.errors import TopologyConflict
from .._core.exchanges import (
    BindingDecl,
    DeclareQueue,
    ExchangeDecl,
    MustExist,
    Plan,
    binding_name,
    conflict,
    preparation,
    queue_conflict,
)
from .._core.listener import QueueSpec, missing_queue

NO_EXCHANGES = Plan()
"""A preparation without exchanges or bindings."""


@dataclass(slots=True)
class Exists:
    """Ask the broker whether queue `name` exists (a passive declare on a throwaway
    channel) and set `exists` before asking `declarations` for the next step."""

    name: str
    exists: bool = False


Declaration = ExchangeDecl | DeclareQueue | BindingDecl
"""A broker operation `declarations` asks for: declare an exchange, declare a queue,
bind."""


def declarations(
    own: Iterable[QueueSpec],
    user: Iterable[tuple[str, dict[str, Any]]] = (),
    existing: Iterable[str] = (),
    exchanges: Plan = NO_EXCHANGES,
) -> Iterator[Exists | Declaration]:
    """The steps of `preparation(own, user, existing, exchanges)` for a client to make,
    in order: each `Exists` answered (its `exists` set) before the next is asked for.
    A queue that must exist and does not raises TopologyConflict; a queue declared only
    when missing is declared only when the answer was no."""
    for step in preparation(own, user, existing, exchanges):
        if isinstance(step, MustExist):
            check = Exists(step.name)
            yield check
            if not check.exists:
                raise TopologyConflict(missing_queue(step.name))
        elif isinstance(step, DeclareQueue) and step.unless_exists:
            check = Exists(step.name)
            yield check
            if not check.exists:
                yield step
        else:
            yield step


def refused(step: Declaration, text: str) -> TopologyConflict:
    """The error for `step` when the broker refused it (403, 404, 406; for a queue
    declare, 406) with reply `text`."""
    if isinstance(step, DeclareQueue):
        return queue_conflict(step, text)
    if isinstance(step, ExchangeDecl):
        return conflict(f"exchange {step.exchange.name!r}", text)
    return conflict(binding_name(step), text)
