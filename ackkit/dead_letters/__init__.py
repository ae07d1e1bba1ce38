"""Tools for dead-lettered messages: read what a dead-letter queue holds (and why each
message is there), and replay chosen ones to their queue."""

from ._letter import DeadLetter, ReplayFilter, ReplayReport
from ._queue import DeadLetterQueue, inspect_dead_letters, replay_dead_letters

__all__ = [
    "DeadLetter",
    "DeadLetterQueue",
    "ReplayFilter",
    "ReplayReport",
    "inspect_dead_letters",
    "replay_dead_letters",
]
