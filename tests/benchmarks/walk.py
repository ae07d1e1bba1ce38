"""The walk: one delivery traced call by call on the in-memory broker, and the
average delivery of a run of many.

    python -m tests.benchmarks.walk [--deliveries N] [-v]

For the pika App and for AsyncApp: one message (a warm-up message first, so the
connection, the channel and the consumer are set up before tracing), a handler that
returns normally, traced with `sys.setprofile` on every thread from the publish until
the broker shows the message acked. It counts

- ackkit functions: distinct ackkit functions called (the test kit, i.e. the broker
  itself and `ackkit._connection.inmemory`, left out);
- files: the distinct ackkit files they live in;
- core calls: calls from a runtime into `ackkit/_core` (a call whose caller is an
  ackkit file outside `_core`), in total, and which ones;
- ticks: core calls made by the periodic tick while the message was in flight (shown
  apart: how many there are depends on timing, not on the delivery); the functions of
  the tick count among the ackkit functions and files (the tick sends the held ack).

The publish and the wait (the test kit's helpers) are left out.

Pull mode (`ackkit.connect`, `ackkit.aconnect`) is walked the same way: one
`get()` and the delivery's `ack()`, after a warm-up message got and acked (the
connection, the channel and the queue's core set up before tracing).

The average (`--deliveries N`, default 2000): each walk again with N messages
instead of one (published in one go by the kit, after the same warm-up), traced until
the broker shows all N acked; in pull mode N `get()`s and `ack()`s. Divided by N:

- calls/d: ackkit function calls (calls, not distinct functions; the same frames left
  out as above, and the tick's apart);
- core/d: core calls as above (from a runtime into `ackkit/_core`);
- tick/d: core calls of the tick.

A call is a function starting: a generator or coroutine resuming (each `await` that
suspended, each `next()`) is not counted again.

What varies from run to run: the single delivery's figures do not, but for the tick
column (timing). Of the averages, pull mode's are exact (the same calls for each
`get()` and `ack()`); App's and AsyncApp's move by a few hundredths to tenths of a
call from run to run, because what a runtime does once per wake-up (a read from the
connection, a pass of its loop, a flush of acks) is shared by however many deliveries
arrived together, which depends on the threads' timing; tick/d depends on how long the
run took (the tick runs on a clock), i.e. on the machine's load.
"""

from __future__ import annotations

import argparse
import asyncio
import dis
import inspect
import os
import sys
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

import ackkit
from ackkit import App, AsyncApp
from ackkit.testing import InMemoryBroker

ROOT = os.path.dirname(ackkit.__file__) + os.sep
CORE = ROOT + "_core" + os.sep
SKIP = (ROOT + "testing" + os.sep, os.path.join(ROOT, "_connection", "inmemory.py"))
# frames of the test kit's publish and wait: what runs under them is not the delivery's
HELPERS = tuple(ROOT + "testing" + os.sep + f for f in ("_helpers.py", "_memory.py", "_handle.py"))
TICKS = {"tick", "_tick", "_tick_forever"}
RESUMABLE = inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR
RESUME = dis.opmap.get("RESUME")


def starts(frame: FrameType) -> bool:
    """Whether a profiler "call" event is the function starting, not a generator or
    coroutine resuming. From 3.11 every code object starts with RESUME 0 and every
    resumption point is a RESUME with a nonzero argument; where that cannot be read,
    the event counts as a call."""
    code = frame.f_code
    if not code.co_flags & RESUMABLE or RESUME is None:
        return True
    raw, i = code.co_code, frame.f_lasti
    if i < 0 or i + 1 >= len(raw) or raw[i] != RESUME:
        return True
    return raw[i + 1] == 0


def ours(path: str) -> bool:
    return path.startswith(ROOT) and not path.startswith(SKIP)


@dataclass
class Walk:
    functions: set[tuple[str, int, str]] = field(default_factory=set)
    core: Counter[str] = field(default_factory=Counter)
    tick_core: Counter[str] = field(default_factory=Counter)
    calls: int = 0  # ackkit calls (starts), the tick's left out
    per: Counter[str] = field(default_factory=Counter)  # calls by function, the tick's out
    tick_calls: int = 0  # ackkit calls made under the tick
    on: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)

    def profile(self, frame: FrameType, event: str, _arg: Any) -> None:
        if not self.on or event != "call":
            return
        code = frame.f_code
        path = code.co_filename
        if not ours(path):
            return
        ticking = False
        f: FrameType | None = frame.f_back
        while f is not None:
            p = f.f_code.co_filename
            if p.startswith(HELPERS):
                return  # the kit's publish or wait
            if f.f_code.co_name in TICKS and ours(p):
                ticking = True
            f = f.f_back
        caller = frame.f_back
        into_core = (
            path.startswith(CORE)
            and caller is not None
            and ours(caller.f_code.co_filename)
            and not caller.f_code.co_filename.startswith(CORE)
        )
        name = f"{os.path.relpath(path, ROOT)}:{code.co_qualname}"
        start = starts(frame)
        with self.lock:
            if start:
                if ticking:
                    self.tick_calls += 1
                else:
                    self.calls += 1
                    self.per[name] += 1
                if into_core:
                    (self.tick_core if ticking else self.core)[name] += 1
            self.functions.add((path, code.co_firstlineno, code.co_qualname))

    @property
    def files(self) -> set[str]:
        return {p for p, _, _ in self.functions}


def _install(w: Walk) -> None:
    threading.setprofile(w.profile)
    sys.setprofile(w.profile)


def _remove() -> None:
    threading.setprofile(None)  # type: ignore[arg-type]
    sys.setprofile(None)


def _run_async(w: Walk, scenario: Callable[[InMemoryBroker], Awaitable[None]]) -> Walk:
    """Trace `scenario` on a fresh in-memory broker, on an event loop of its own."""

    async def main(broker: InMemoryBroker) -> None:
        await scenario(broker)

    with InMemoryBroker() as broker:
        _install(w)
        try:
            asyncio.run(main(broker))
        finally:
            _remove()
    return w


def _bodies(n: int) -> list[bytes]:
    return [b"one"] if n == 1 else [b"%d" % i for i in range(n)]


def _timeout(n: int) -> float:
    """How long the wait for N acks may take, traced (well above what it takes)."""
    return 10.0 + 0.05 * n


def walk_sync(n: int = 1) -> Walk:
    w = Walk()
    with InMemoryBroker() as broker:
        app = App(broker.url, shutdown_timeout=2)

        @app.listener("walk")
        def handle(body: bytes) -> None:
            pass

        _install(w)
        try:
            with app.running():
                broker.publish("walk", b"warm-up")
                broker.wait_for("walk", ready=0, unacked=0)
                time.sleep(0.2)
                w.on = True
                broker.publish_many("walk", _bodies(n))
                broker.wait_for("walk", ready=0, unacked=0, timeout=_timeout(n))
                w.on = False
        finally:
            _remove()
    return w


def walk_async(n: int = 1) -> Walk:
    w = Walk()

    async def scenario(broker: InMemoryBroker) -> None:
        app = AsyncApp(broker.url, shutdown_timeout=2)

        @app.listener("walk")
        async def handle(body: bytes) -> None:
            pass

        async with app.running():
            broker.publish("walk", b"warm-up")
            await broker.wait_for_async("walk", ready=0, unacked=0)
            await asyncio.sleep(0.2)
            w.on = True
            broker.publish_many("walk", _bodies(n))
            await broker.wait_for_async("walk", ready=0, unacked=0, timeout=_timeout(n))
            w.on = False

    return _run_async(w, scenario)


def walk_pull(n: int = 1) -> Walk:
    w = Walk()
    with InMemoryBroker() as broker, ackkit.connect(broker.url) as conn:
        conn.declare_queue("walk")
        _install(w)
        try:
            broker.publish("walk", b"warm-up")
            d = conn.get("walk")
            assert d is not None
            d.ack()
            broker.publish_many("walk", _bodies(n))
            w.on = True
            for _ in range(n):
                d = conn.get("walk")
                assert d is not None
                d.ack()
            broker.wait_for("walk", ready=0, unacked=0, timeout=_timeout(n))
            w.on = False
        finally:
            _remove()
    return w


def walk_apull(n: int = 1) -> Walk:
    w = Walk()

    async def scenario(broker: InMemoryBroker) -> None:
        async with ackkit.aconnect(broker.url) as conn:
            await conn.declare_queue("walk")
            broker.publish("walk", b"warm-up")
            d = await conn.get("walk")
            assert d is not None
            await d.ack()
            broker.publish_many("walk", _bodies(n))
            w.on = True
            for _ in range(n):
                d = await conn.get("walk")
                assert d is not None
                await d.ack()
            await broker.wait_for_async("walk", ready=0, unacked=0, timeout=_timeout(n))
            w.on = False

    return _run_async(w, scenario)


KINDS: list[tuple[str, Callable[[int], Walk]]] = [
    ("App (pika)", walk_sync),
    ("AsyncApp", walk_async),
    ("connect", walk_pull),
    ("aconnect", walk_apull),
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.benchmarks.walk",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="list the functions")
    parser.add_argument(
        "--deliveries",
        type=int,
        default=2000,
        metavar="N",
        help="messages in the run the averages are taken over (default 2000)",
    )
    args = parser.parse_args(argv)
    if args.deliveries < 1:
        parser.error("--deliveries must be at least 1")
    n = args.deliveries
    rows = [(name, run(1), run(n)) for name, run in KINDS]
    print(
        f"{'runtime':12} {'ackkit calls':>12} {'files':>6} {'core calls':>10} {'tick':>5}"
        f" {'calls/d':>8} {'core/d':>7} {'tick/d':>7}"
    )
    for name, w, avg in rows:
        print(
            f"{name:12} {len(w.functions):12} {len(w.files):6} "
            f"{sum(w.core.values()):10} {sum(w.tick_core.values()):5}"
            f" {avg.calls / n:8.2f} {sum(avg.core.values()) / n:7.2f}"
            f" {sum(avg.tick_core.values()) / n:7.3f}"
        )
    print(f"(calls/d, core/d, tick/d: per delivery, over a run of {n})")
    for name, w, avg in rows:
        print(f"\n{name}: core calls")
        for fn, count in sorted(w.core.items()):
            print(f"  {count} x {fn}")
        print(f"{name}: core calls per delivery over {n}")
        for fn, count in sorted(avg.core.items()):
            print(f"  {count / n:.3f} x {fn}")
        if args.verbose:
            print(f"{name}: core calls of the tick")
            for fn, count in sorted(w.tick_core.items()):
                print(f"  {count} x {fn}")
            print(f"{name}: core calls of the tick over {n} ({avg.tick_calls} ackkit calls)")
            for fn, count in sorted(avg.tick_core.items()):
                print(f"  {count} x {fn}")
            print(f"{name}: calls per delivery over {n}, by function")
            for fn, count in avg.per.most_common():
                print(f"  {count / n:6.3f} x {fn}")
            print(f"{name}: functions")
            for path, line, qual in sorted(w.functions):
                print(f"  {os.path.relpath(path, ROOT)}:{line} {qual}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
