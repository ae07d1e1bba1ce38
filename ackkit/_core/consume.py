"""What a listener does when the broker will not let it consume (no I/O).

A listener asks for a consumer with basic.consume. The broker answers with
consume-ok, or closes the channel with a reply code: the queue is gone (404),
another consumer holds it exclusively (403 "in exclusive use"), the user may not
read it (403), it is another connection's exclusive queue (405), or the
consumer's arguments are refused (406). It may also cancel a consumer it had
accepted (basic.cancel: the queue was deleted, a 4.3 consumer timeout).

`Consuming` turns each of these into a `ConsumeStep` the runtime carries out,
so that a listener that cannot consume is never a quiet zombie: it consumes
again, declares its queue again and consumes, stands by in a named state
(`FlowState.STANDBY`) with one log line, or stops the app (the health rule:
`fail()`) with the broker's own reason. `channels_needed` is the check that a
connection can carry every listener's channel at all.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from .errors import ConsumeRefused
from .gate import Flow

RETRY_DELAY = 1.0
"""Seconds before a listener whose channel closed consumes again on a new one."""
STANDBY_POLL = 2.0
"""Seconds between a standby listener's tries to take its queue over."""
MAX_REDECLARES = 3
"""Declares of a deleted queue in a row, without a consumer between them, before the
app stops: the queue is deleted again as soon as it is declared (someone else deletes
it, or a policy expires it), which is no state to loop in."""

NOT_FOUND, ACCESS_REFUSED, RESOURCE_LOCKED, PRECONDITION_FAILED = 404, 403, 405, 406


class ConsumeMove(str, Enum):
    """What the runtime does next with a listener whose consumer is gone or refused."""

    RETRY = "retry"
    """Open a new channel after `delay` and consume again (the usual pause)."""
    DECLARE = "declare"
    """Declare the listener's queue again (its arguments, dead-letter and delay queues,
    bindings) on the connection, then consume on a new channel."""
    STANDBY = "standby"
    """Another consumer holds the queue: try again after `delay`, quietly; the listener
    is in `FlowState.STANDBY` and counts as started."""
    FAIL = "fail"
    """Stop the app with `error` (the health rule: `fail()`)."""


@dataclass(frozen=True, slots=True)
class ConsumeStep:
    """One decision about a refused or cancelled consumer."""

    move: ConsumeMove
    delay: float = 0.0
    """Seconds to wait before the next channel (RETRY, STANDBY)."""
    log: str | None = None
    """A WARNING to log now; None: nothing to log (a standby's later tries are quiet)."""
    error: ConsumeRefused | None = None
    """FAIL: what the app stops with."""


class Consuming:
    """One listener's consumer: refused, standing by, or taken over."""

    def __init__(
        self, flow: Flow, listener: str, queue: str, *, declare: bool, exclusive: bool
    ) -> None:
        self.flow = flow  # its state shows the standby (`FlowState.STANDBY`)
        self.listener = listener
        self.queue = queue
        self.declare = declare
        self.exclusive = exclusive
        self.redeclares = 0  # declares of a deleted queue since the last consume-ok
        self.took_over = 0  # standbys that ended with a consumer of ours
        self.refusals = 0  # consume refusals seen (of any kind)

    @property
    def standby(self) -> bool:
        """Another consumer holds the queue exclusively; the listener waits for it."""
        return self.flow.standby

    @standby.setter
    def standby(self, on: bool) -> None:
        self.flow.standby = on

    def refused(self, code: int | None, text: str) -> ConsumeStep:
        """The broker closed the channel (`code`, `text`) before it answered the
        listener's basic.consume."""
        self.refusals += 1
        text = text or ""
        where = f"{self.listener}: the broker refused to consume queue {self.queue!r}"
        if code == NOT_FOUND:
            if not self.declare:
                self.standby = False
                return self._fail(
                    f"{where}: {text}. The queue was deleted, and its listener has "
                    "declare=False: ackkit does not declare it again (declare it, then "
                    "start the app again; or let ackkit declare it: declare=True)"
                )
            self.redeclares += 1
            if self.redeclares > MAX_REDECLARES:
                return self._fail(
                    f"{where}: {text}. Declared it again {MAX_REDECLARES} times and each "
                    "time it was gone before a consumer could attach: something deletes it"
                )
            self.standby = False
            log = None
            if self.redeclares == 1:
                log = (
                    f"{self.listener}: queue {self.queue!r} was deleted ({text}); declaring "
                    "it again with its dead-letter and delay queues and bindings, then "
                    "consuming (what the deleted queue held is gone)"
                )
            return ConsumeStep(ConsumeMove.DECLARE, log=log)
        if code == ACCESS_REFUSED and "exclusive use" in text:
            first = not self.standby
            self.standby = True
            log = None
            if first:
                who = "another consumer holds it exclusively"
                if self.exclusive:
                    who = "another consumer holds it (this listener is exclusive=True)"
                log = (
                    f"{self.listener}: standing by on queue {self.queue!r}: {who} ({text}); "
                    f"trying every {STANDBY_POLL:g} s, taking over when it frees"
                )
            return ConsumeStep(ConsumeMove.STANDBY, STANDBY_POLL, log)
        if code in (ACCESS_REFUSED, RESOURCE_LOCKED, PRECONDITION_FAILED):
            self.standby = False
            return self._fail(f"{where}: {text}")
        return ConsumeStep(ConsumeMove.RETRY, RETRY_DELAY)

    def consumed(self) -> str | None:
        """consume-ok: the listener consumes. An INFO line to log when it ends a standby
        or a re-declare (None otherwise)."""
        line = None
        if self.standby:
            self.took_over += 1
            line = f"{self.listener}: took over queue {self.queue!r}; consuming (standby ended)"
        elif self.redeclares:
            line = f"{self.listener}: queue {self.queue!r} declared again; consuming"
        self.standby = False
        self.redeclares = 0
        return line

    def _fail(self, why: str) -> ConsumeStep:
        return ConsumeStep(ConsumeMove.FAIL, error=ConsumeRefused(why))


CHANNELS_PER_LISTENER = 2
"""A listener's consumer channel and its own confirm channel for copies (both runtimes)."""


def channels_needed(listeners: int, per_listener: int = CHANNELS_PER_LISTENER) -> int:
    """Channels one app keeps open on its connection: `per_listener` per listener (its
    consumer's and its copies'), and one for the app's own publishes."""
    return listeners * per_listener + 1


def spare_channels(
    listeners: int, channel_max: int, per_listener: int = CHANNELS_PER_LISTENER
) -> int:
    """Channels the connection allows beyond those the app keeps open (`channels_needed`):
    what the app's publishing channels per exchange may use
    (`ackkit._messages.publish.channel_for`)."""
    return max(0, (channel_max or 65535) - channels_needed(listeners, per_listener))


def check_channels(
    listeners: int, channel_max: int, where: str, per_listener: int = CHANNELS_PER_LISTENER
) -> str | None:
    """Why the connection cannot carry the app (a negotiated `channel_max` below what it
    needs), or None. `channel_max` 0 means the broker sets no limit (65535)."""
    need = channels_needed(listeners, per_listener)
    limit = channel_max or 65535
    if need <= limit:
        return None
    each = "one channel each" if per_listener == 1 else f"{per_listener} channels each"
    return (
        f"the app needs {need} channels ({listeners} listeners, {each}, and one "
        f"for publishing) but the connection to {where} allows channel_max={limit}: raise "
        "channel_max (the URL's ?channel_max= and the broker's channel_max setting) or "
        "split the listeners over more apps"
    )
