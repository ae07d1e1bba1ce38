"""ListenerCore is composed of its parts, not mixed from them: a small façade."""

from __future__ import annotations

from ackkit._core.fates import Fates
from ackkit._core.gating import Gating
from ackkit._core.listener import ListenerCore
from ackkit._core.lost import LostRuns
from ackkit._core.policy import ListenerPolicy
from ackkit._core.shutdown import Shutdown
from ackkit._core.topology import Queues

MAX_PUBLIC = 25


def public(obj: object) -> list[str]:
    return [n for n in dir(obj) if not n.startswith("_")]


def test_the_core_inherits_from_none_of_its_parts() -> None:
    assert ListenerCore.__bases__ == (object,)
    for part in (Fates, Gating, LostRuns, Queues, Shutdown):
        assert not issubclass(ListenerCore, part)


def test_the_facade_keeps_few_public_members() -> None:
    core = ListenerCore(ListenerPolicy("l", "q"))
    names = public(core)
    assert len(names) <= MAX_PUBLIC, names


def test_the_parts_a_runtime_reaches_by_name() -> None:
    core = ListenerCore(ListenerPolicy("l", "q"))
    assert isinstance(core.queues, Queues)
    assert isinstance(core.gating, Gating)
    assert isinstance(core.shutdown, Shutdown)
    assert isinstance(core.lost, LostRuns)
