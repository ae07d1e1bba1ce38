"""The walk: one delivery traced call by call on the in-memory broker.

    python -m tests.benchmarks.walk

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
"""

from __future__ import annotations

import argparse
import asyncio
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


def ours(path: str) -> bool:
    return path.startswith(ROOT) and not path.startswith(SKIP)


@dataclass
class Walk:
    functions: set[tuple[str, int, str]] = field(default_factory=set)
    core: Counter[str] = field(default_factory=Counter)
    tick_core: Counter[str] = field(default_factory=Counter)
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
        with self.lock:
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


def walk_sync() -> Walk:
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
                broker.publish("walk", b"one")
                broker.wait_for("walk", ready=0, unacked=0)
                w.on = False
        finally:
            _remove()
    return w


def walk_async() -> Walk:
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
            broker.publish("walk", b"one")
            await broker.wait_for_async("walk", ready=0, unacked=0)
            w.on = False

    return _run_async(w, scenario)


def walk_pull() -> Walk:
    w = Walk()
    with InMemoryBroker() as broker, ackkit.connect(broker.url) as conn:
        conn.declare_queue("walk")
        _install(w)
        try:
            for body in (b"warm-up", b"one"):
                broker.publish("walk", body)
                w.on = body == b"one"
                d = conn.get("walk")
                assert d is not None
                d.ack()
                w.on = False
            broker.wait_for("walk", ready=0, unacked=0)
        finally:
            _remove()
    return w


def walk_apull() -> Walk:
    w = Walk()

    async def scenario(broker: InMemoryBroker) -> None:
        async with ackkit.aconnect(broker.url) as conn:
            await conn.declare_queue("walk")
            for body in (b"warm-up", b"one"):
                broker.publish("walk", body)
                w.on = body == b"one"
                d = await conn.get("walk")
                assert d is not None
                await d.ack()
                w.on = False
            await broker.wait_for_async("walk", ready=0, unacked=0)

    return _run_async(w, scenario)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.benchmarks.walk", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="list the functions")
    args = parser.parse_args(argv)
    rows = [
        ("App (pika)", walk_sync()),
        ("AsyncApp", walk_async()),
        ("connect", walk_pull()),
        ("aconnect", walk_apull()),
    ]
    print(f"{'runtime':12} {'ackkit calls':>12} {'files':>6} {'core calls':>10} {'tick':>5}")
    for name, w in rows:
        print(
            f"{name:12} {len(w.functions):12} {len(w.files):6} "
            f"{sum(w.core.values()):10} {sum(w.tick_core.values()):5}"
        )
    for name, w in rows:
        print(f"\n{name}: core calls")
        for fn, n in sorted(w.core.items()):
            print(f"  {n} x {fn}")
        if args.verbose:
            print(f"{name}: core calls of the tick")
            for fn, n in sorted(w.tick_core.items()):
                print(f"  {n} x {fn}")
            print(f"{name}: functions")
            for path, line, qual in sorted(w.functions):
                print(f"  {os.path.relpath(path, ROOT)}:{line} {qual}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
