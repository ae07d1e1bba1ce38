"""Benchmark cases: what a case is and how the harness runs it.

The case protocol
=================

A case is a plain function registered under a stable id::

    from tests.benchmarks.cases import case

    @case("pika.each")
    def pika_each(url: str, queue: str, n_messages: int) -> None:
        ...  # consume and ack n_messages from `queue`, then return

* ``url`` is the AMQP URL of the broker, ``queue`` a fresh durable classic queue that
  the harness declared and pre-filled with ``n_messages`` persistent messages (200-byte
  bodies by default) before calling you. The pre-fill is not timed.
* The function runs in a FRESH PROCESS (``python -m tests.benchmarks.worker``) that has
  already imported the case's module and its ``requires`` modules, so import time is
  not timed. Wall time and the process's CPU time (user + sys, incl. reaped children)
  are measured around the call and nothing else.
* A case may time its own window instead (e.g. a steady state after start-up): it
  returns ``{"messages": m, "seconds": s}`` and its rate is m / s; wall and CPU time
  are still measured around the whole call.
* Return only when all ``n_messages`` have been consumed AND their acks have been sent
  (closing the connection cleanly is the easiest way to flush them). Stop by yourself
  after ``n_messages``: do not wait for the queue to go idle.
* Never hang: use :class:`Watchdog` (``stalled()`` turns true when no progress was made
  for :data:`IDLE_TIMEOUT_S` or the overall deadline passed) and raise
  :class:`CaseTimeout`. Feed it a counter that moves on ANY progress (deliveries
  handled, failed, retried...), not only final acks: a case whose first pass only
  fails or retries must not look idle. The harness also kills the worker after a
  hard deadline.
* If the case cannot run here (library part not written yet, optional dependency
  missing, no Java for Spark...), raise :class:`CaseUnavailable`: the harness reports
  "n/a" and moves on. Raise it from an ``available`` hook to be skipped before the
  queue is pre-filled.
* After the worker exits the harness checks the broker: once the queue has no
  consumer, it must have 0 ready messages (every ack landed), otherwise the run is
  marked invalid. Cases with other expectations pass ``check=``.

Hooks (keyword arguments of :func:`case`), all optional:

``setup(url, queue, n)``
    Runs in the harness before the timed call, replacing the default "declare durable
    classic queue + pre-fill n messages" (see :func:`tests.benchmarks.broker.prefill`
    to reuse it). Use it for special topologies: poison messages plus a DLQ, retry
    queues... Declare extra queues with names derived from ``queue`` (``queue + ".dlq"``)
    so that they are unique per run.
``check(url, queue, n) -> str | None``
    Runs after the worker exited; return ``None`` when the run is valid, else a short
    reason. Default: :func:`tests.benchmarks.broker.check_drained`.
``cleanup(url, queue, n)``
    Deletes what ``setup`` made. Default: delete ``queue``.
``available()``
    Runs in the worker before pre-fill; raise :class:`CaseUnavailable` to skip.
``requires``
    Module names imported by the worker before timing; a missing one makes the case
    "n/a" with the import error as reason.
``prefill=False``
    The default setup only declares the (empty) queue, e.g. for publishing cases.
``timeout_s``
    Hard deadline for the whole call (default :func:`default_timeout`).

To add a case: write the function in one of the modules listed in :data:`CASE_MODULES`
(or add a module there), decorate it, done. ``python -m tests.benchmarks --cases <id>``
runs it alone. Case ids are compared across runs over time: never rename one.
"""

from __future__ import annotations

import importlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

CaseFn = Callable[[str, str, int], "dict[str, float] | None"]
SetupFn = Callable[[str, str, int], None]
CheckFn = Callable[[str, str, int], "str | None"]
AvailableFn = Callable[[], None]

#: Modules whose import registers cases, in display order.
CASE_MODULES: tuple[str, ...] = ("raw", "peers", "ackkit_cases", "inbox_cases")

#: Seconds without progress after which a case should give up.
IDLE_TIMEOUT_S = float(os.environ.get("BENCH_IDLE_TIMEOUT", "15"))

#: Message body size used by the default pre-fill.
BODY_SIZE = 200


class CaseUnavailable(Exception):
    """The case cannot run here; the harness reports it as n/a and keeps going."""


class CaseTimeout(Exception):
    """The case made no progress in time; the run is reported as an error."""


def default_timeout(n_messages: int) -> float:
    """Hard deadline for one case call: generous, but bounded."""
    return 60.0 + n_messages / 250.0


@dataclass(frozen=True)
class Case:
    id: str
    func: CaseFn
    description: str = ""
    prefill: bool = True
    requires: tuple[str, ...] = ()
    setup: SetupFn | None = None
    check: CheckFn | None = None
    cleanup: SetupFn | None = None
    available: AvailableFn | None = None
    timeout_s: float | None = None

    @property
    def module(self) -> str:
        return self.func.__module__

    def timeout_for(self, n_messages: int) -> float:
        return self.timeout_s if self.timeout_s is not None else default_timeout(n_messages)


_REGISTRY: dict[str, Case] = {}


def case(
    case_id: str,
    *,
    description: str = "",
    prefill: bool = True,
    requires: tuple[str, ...] = (),
    setup: SetupFn | None = None,
    check: CheckFn | None = None,
    cleanup: SetupFn | None = None,
    available: AvailableFn | None = None,
    timeout_s: float | None = None,
) -> Callable[[CaseFn], CaseFn]:
    """Register ``func`` as the benchmark case ``case_id`` (see the module docstring)."""

    def register(func: CaseFn) -> CaseFn:
        if case_id in _REGISTRY and _REGISTRY[case_id].func is not func:
            raise ValueError(f"benchmark case {case_id!r} registered twice")
        _REGISTRY[case_id] = Case(
            id=case_id,
            func=func,
            description=description or _first_line(func.__doc__),
            prefill=prefill,
            requires=requires,
            setup=setup,
            check=check,
            cleanup=cleanup,
            available=available,
            timeout_s=timeout_s,
        )
        return func

    return register


def _first_line(doc: str | None) -> str:
    lines = (doc or "").strip().splitlines()
    return lines[0].strip() if lines else ""


#: Case modules that failed to import (module name -> error), filled by :func:`load_all`.
LOAD_ERRORS: dict[str, str] = {}


def load_all() -> dict[str, Case]:
    """Import every module of :data:`CASE_MODULES`; return the registry in order.

    A module that fails to import is recorded in :data:`LOAD_ERRORS` (the harness
    prints it) instead of taking the other modules' cases down with it.
    """
    for name in CASE_MODULES:
        module = f"{__name__}.{name}"
        try:
            importlib.import_module(module)
        except Exception as exc:
            LOAD_ERRORS[module] = f"{type(exc).__name__}: {exc}"
    return dict(_REGISTRY)


def load_one(module: str, case_id: str) -> Case:
    """Import one case module (as the worker does) and return the case."""
    importlib.import_module(module)
    try:
        return _REGISTRY[case_id]
    except KeyError:
        raise LookupError(f"module {module} did not register case {case_id!r}") from None


@dataclass
class Watchdog:
    """Progress watchdog for case loops.

    Call :meth:`stalled` with the number of messages handled so far (from a timer or
    between waits); it returns True once no progress was seen for ``idle_s`` seconds or
    ``total_s`` seconds passed since creation.
    """

    n_messages: int
    idle_s: float = IDLE_TIMEOUT_S
    total_s: float | None = None
    _start: float = field(default_factory=time.monotonic)
    _last_count: int = -1
    _last_change: float = field(default_factory=time.monotonic)

    def __post_init__(self) -> None:
        if self.total_s is None:
            self.total_s = default_timeout(self.n_messages)

    def stalled(self, count: int) -> bool:
        now = time.monotonic()
        if count != self._last_count:
            self._last_count = count
            self._last_change = now
        assert self.total_s is not None
        return now - self._last_change > self.idle_s or now - self._start > self.total_s

    def error(self, count: int) -> CaseTimeout:
        return CaseTimeout(
            f"stalled after {count}/{self.n_messages} messages "
            f"(idle {self.idle_s:.0f}s or total {self.total_s:.0f}s exceeded)"
        )
