"""The inbox's work written once for both clients: a script is a generator that yields
what it needs done (a statement on a psycopg connection, a publish, or a request of the
inbox runner's own) and gets the answer back, the way `ackkit._interpreter.attempts`
serves both runtimes. `drive` carries a script out with blocking calls (psycopg's
Connection, threads), `adrive` on the event loop (AsyncConnection, tasks): an error of
the call is thrown into the script, which handles it or lets it through."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias, TypeVar

from .._messages.publish import Outgoing

T = TypeVar("T")

Script: TypeAlias = Generator[Any, Any, T]
"""A generator yielding requests and returning its result."""


@dataclass(frozen=True, slots=True)
class Sql:
    """Run `query` on `conn`; the answer: its first row (`fetch="one"`), all its rows
    ("all"), how many rows it touched ("count"), or None. `whole`: on the event loop, it
    runs to its end even when the task is cancelled meanwhile (`to_the_end`)."""

    conn: Any
    query: str
    params: Any = None
    fetch: Literal["", "one", "all", "count"] = ""
    whole: bool = False


@dataclass(frozen=True, slots=True)
class Atomic:
    """Run `statements` on `conn` in one transaction of their own."""

    conn: Any
    statements: Sequence[str]


@dataclass(frozen=True, slots=True)
class Publish:
    """Publish `msg` with the driver's publisher (confirmed before the answer)."""

    msg: Outgoing


def _resume(script: Script[Any], answer: Any = None, err: BaseException | None = None) -> Any:
    """(True, what `script` returned) once it ended, else (False, its next request)."""
    try:
        return False, script.send(answer) if err is None else script.throw(err)
    except StopIteration as end:
        return True, end.value


def drive(script: Script[T], do: Callable[[Any], Any]) -> T:
    """Run `script` to its end, each request carried out by `do` (blocking)."""
    done, out = _resume(script)
    while not done:
        try:
            answer = do(out)
        except BaseException as e:
            done, out = _resume(script, err=e)
        else:
            done, out = _resume(script, answer)
    return out  # type: ignore[no-any-return]


async def adrive(script: Script[T], do: Callable[[Any], Awaitable[Any]]) -> T:
    """`drive` on the event loop: each request is awaited (a cancel is thrown into the
    script like any error)."""
    done, out = _resume(script)
    while not done:
        try:
            answer = await do(out)
        except BaseException as e:
            done, out = _resume(script, err=e)
        else:
            done, out = _resume(script, answer)
    return out  # type: ignore[no-any-return]


def on_connection(publish: Callable[[Outgoing], object] | None = None) -> Callable[[Any], Any]:
    """What carries out `Sql`, `Atomic` (on a psycopg Connection) and `Publish` (with
    `publish`) for `drive`."""

    def do(req: Any) -> Any:
        kind = type(req)
        if kind is Sql:
            cur = req.conn.execute(req.query, req.params)
            if req.fetch == "one":
                return cur.fetchone()
            if req.fetch == "all":
                return cur.fetchall()
            return cur.rowcount if req.fetch == "count" else None
        if kind is Atomic:
            with req.conn.transaction():
                for s in req.statements:
                    req.conn.execute(s)
            return None
        if kind is Publish and publish is not None:
            return publish(req.msg)
        raise TypeError(f"not a request of a database script: {req!r}")

    return do


def on_aconnection(
    publish: Callable[[Outgoing], Awaitable[object]] | None = None,
) -> Callable[[Any], Awaitable[Any]]:
    """`on_connection` for a psycopg AsyncConnection and an async `publish` (`adrive`)."""

    async def do(req: Any) -> Any:
        kind = type(req)
        if kind is Sql:
            aw = req.conn.execute(req.query, req.params)
            cur = await (to_the_end(aw) if req.whole else aw)
            if req.fetch == "one":
                return await cur.fetchone()
            if req.fetch == "all":
                return await cur.fetchall()
            return cur.rowcount if req.fetch == "count" else None
        if kind is Atomic:
            async with req.conn.transaction():
                for s in req.statements:
                    await req.conn.execute(s)
            return None
        if kind is Publish and publish is not None:
            return await publish(req.msg)
        raise TypeError(f"not a request of a database script: {req!r}")

    return do


async def to_the_end(aw: Awaitable[T]) -> T:
    """`await aw`, on to its end even if the awaiting task is cancelled meanwhile; the
    cancel is raised once it ended."""
    inner = asyncio.ensure_future(aw)
    cancelled = False
    while not inner.done():
        try:
            await asyncio.wait({inner})  # a cancel reaches this task, never `inner`
        except asyncio.CancelledError:
            cancelled = True
    if cancelled:
        if not inner.cancelled():
            inner.exception()  # retrieved: the cancel is what the caller hears
        raise asyncio.CancelledError
    return inner.result()
