"""What the outbox relay does about a row whose exchange does not exist.

The broker answers a publish to a missing exchange by closing the channel (404
NOT_FOUND). Sent again at once it fails again, and the rows behind it wait for ever.
So the relay holds that exchange: its rows stay in the outbox, in their order, and
are tried again after a backoff (1 s, doubling, at most 60 s) while the rows to other
exchanges go on. The first row it confirms ends the hold.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from .inbox import Backoff

MISSING_BACKOFF = Backoff(first=1.0, cap=60.0, tries=1_000)
"""Waits before the rows to a missing exchange are tried again."""

_NO_EXCHANGE = re.compile(r"NOT_FOUND - no exchange '(.*?)' in vhost '")


def missing_exchange(error: BaseException) -> str | None:
    """The exchange a publish failed on because it does not exist (the broker's
    "NOT_FOUND - no exchange 'x' in vhost 'v'", in whichever error the client raised
    for it, or in its cause); None for any other failure."""
    seen: set[int] = set()
    e: BaseException | None = error
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        found = _NO_EXCHANGE.search(f"{e} {getattr(e, 'reply_text', '')}")
        if found:
            return found.group(1)
        e = e.__cause__ or e.__context__
    return None


@dataclass
class Holds:
    """The exchanges whose rows the relay leaves in the outbox for now: exchange ->
    (failed tries in a row, monotonic time of the next try)."""

    held: dict[str, tuple[int, float]] = field(default_factory=dict)

    def waiting(self, now: float) -> list[str]:
        """The exchanges whose rows are not tried at `now` (sorted)."""
        return sorted(name for name, (_, due) in self.held.items() if due > now)

    def missing(self, exchange: str, now: float) -> float:
        """`exchange` does not exist: its rows wait; the seconds until they are tried
        again."""
        fails = self.held.get(exchange, (0, now))[0] + 1
        wait = MISSING_BACKOFF.delay(min(fails, MISSING_BACKOFF.tries - 1))
        delay = MISSING_BACKOFF.cap if wait is None else max(wait, MISSING_BACKOFF.first)
        self.held[exchange] = (fails, now + delay)
        return delay

    def sent(self, exchange: str) -> None:
        """A row to `exchange` was confirmed: it exists (again)."""
        self.held.pop(exchange, None)
