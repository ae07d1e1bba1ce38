"""Turning the records, the dead-letter queues and the logs into the chaos figures.

Pure functions over plain data, so they are unit-testable without a broker.

Definitions (per message_id):

* runs: handler invocations (``S`` records). A *re-run* is a run whose attempt
  number already ran for that message: it happens when a copy is duplicated by a
  fault (the retry copy was confirmed, then the connection died before the
  original's ack left) or when a redelivery was not counted as an attempt.
* A fault *explains* a re-run or a second dead-letter copy when it happened
  during the message's life before it. Faults are the injected ones (kills, cuts,
  broker restarts) and channels the broker closed (consumer timeouts), except
  that a slow message's own consumer timeouts never explain its re-runs.
* lost: a good message neither handled (an ``E ... ok`` record) nor dead-lettered.
* duplicates: messages handled OK more than once, dead-lettered more than once,
  both handled OK and dead-lettered, or re-run.
* dead_letter_mismatch: a poison, slow or bad message with no dead-letter copy, a
  copy whose ackkit-reason is not the expected one, or more than one copy with no
  fault during its life (one fault can add more than one: every copy of the
  message that had its settle in flight on the lost channel goes on as a lineage).
  "attempts exhausted (n of m, last one lost)" is the expected reason of any
  message redelivered past max_attempts by losses: ackkit checks the attempts
  before it looks at the body.
* over_attempts: messages whose handler ran more than max_attempts times once
  the explained re-runs are set aside, or ran with an attempt number above it.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from .messages import EXPECTED_REASON, HOSTILE_KINDS, kind_of

LOST_LAST = "last one lost)"


@dataclass
class Run:
    t: float
    attempt: int
    redelivered: bool


@dataclass
class Story:
    """Everything seen of one message."""

    runs: list[Run] = field(default_factory=list)
    ok: int = 0
    failed: int = 0
    dead: list[tuple[str, float]] = field(default_factory=list)  # (reason, dead-lettered at)

    def times(self) -> list[float]:
        return [r.t for r in self.runs] + [t for _, t in self.dead]


@dataclass(frozen=True)
class Fault:
    t0: float
    t1: float
    kind: str  # kill | cut | restart | timeout


def parse_records(lines: Iterable[str], stories: dict[str, Story]) -> int:
    """Add record lines to `stories`; returns how many lines were not understood."""
    bad = 0
    for line in lines:
        parts = line.split()
        if len(parts) < 5 or parts[0] not in ("S", "E"):
            bad += 1  # e.g. a line cut short by SIGKILL (cannot happen with whole writes)
            continue
        try:
            t, mid, attempt = float(parts[1]), parts[2], int(parts[3])
        except ValueError:
            bad += 1
            continue
        s = stories.setdefault(mid, Story())
        if parts[0] == "S":
            s.runs.append(Run(t, attempt, parts[4] == "1"))
        elif parts[4] == "ok":
            s.ok += 1
        else:
            s.failed += 1
    return bad


class FaultIndex:
    def __init__(self, faults: Sequence[Fault]) -> None:
        self.faults = sorted(faults, key=lambda f: f.t0)
        self.starts = [f.t0 for f in self.faults]

    def count(self, lo: float, hi: float, *, timeouts: bool = True) -> int:
        """Faults whose interval meets [lo, hi]."""
        if hi < lo:
            return 0
        n = 0
        end = bisect.bisect_right(self.starts, hi)
        for f in self.faults[:end]:
            if f.t1 >= lo and (timeouts or f.kind != "timeout"):
                n += 1
        return n


def analyse(
    manifest: Iterable[str],
    stories: Mapping[str, Story],
    faults: Sequence[Fault],
    max_attempts: int,
    slack: float = 1.0,
    expected: Mapping[str, str | tuple[str, ...]] = EXPECTED_REASON,
) -> dict[str, int]:
    idx = FaultIndex(faults)
    fig = defaultdict(int)
    for mid in manifest:
        kind = kind_of(mid)
        s = stories.get(mid) or Story()
        times = s.times()
        life_lo = min(times) - slack if times else 0.0
        own_timeouts = kind != "slow"
        # -- re-runs and over-attempts
        first: dict[int, float] = {}
        reruns = explained = 0
        top = 0
        for r in sorted(s.runs, key=lambda r: r.t):
            top = max(top, r.attempt)
            if r.attempt in first:
                reruns += 1
                if idx.count(life_lo, r.t + slack, timeouts=own_timeouts) > 0:
                    explained += 1
            else:
                first[r.attempt] = r.t
        fig["runs"] += len(s.runs)
        fig["reruns"] += reruns
        fig["unexplained_reruns"] += reruns - explained
        if top > max_attempts or len(s.runs) - explained > max_attempts:
            fig["over_attempts"] += 1
        # -- dead letters
        copies = len(s.dead)
        fig["dead_lettered"] += 1 if copies else 0
        fig["dead_letter_copies"] += copies
        if copies > 1:
            fig["dlq_duplicates"] += 1
        life_faults = idx.count(life_lo, max(times) + slack) if times else 0
        if kind == "good":
            fig["good"] += 1
            if s.ok:
                fig["handled_ok"] += 1
            if not s.ok and not copies:
                fig["lost"] += 1
            if copies:
                fig["good_dead_lettered"] += 1
                if any("attempts exhausted" not in reason for reason, _ in s.dead):
                    fig["good_dead_lettered_unexpected"] += 1
            if s.ok > 1 or copies > 1 or (s.ok and copies) or reruns:
                fig["duplicates"] += 1
            continue
        fig[kind if kind in ("poison", "slow") else "bad"] += 1
        if kind in HOSTILE_KINDS:
            fig["hostile"] += 1
        want = expected[kind]
        wants = (want,) if isinstance(want, str) else want

        def fits(reason: str, wants: tuple[str, ...] = wants) -> bool:
            return any(w in reason for w in wants)

        if any(LOST_LAST in reason and not fits(reason) for reason, _ in s.dead):
            # Redelivered past max_attempts before its body was looked at: the attempt
            # limit is checked first (decoding may be what kills a consumer).
            fig["dead_lettered_after_losses"] += 1
        if (
            not copies
            or any(not fits(reason) and LOST_LAST not in reason for reason, _ in s.dead)
            or (copies > 1 and not life_faults)
        ):
            fig["dead_letter_mismatch"] += 1
        if copies > 1 or reruns:
            fig["duplicates"] += 1
    return dict(fig)
