"""The stream source's broker I/O (rstream): it only carries out what the pure planning
in `ackkit._core.stream_offsets` decided.

Each process keeps one `Link` per broker it reads: an event loop on a thread of its own,
holding a locator connection (metadata, partitions, stored offsets) and one data
connection per broker node (subscriptions). Planning on the driver and reading on an
executor then cost a subscription each, not a connection: rstream 1.1.1 waits 0.2 s in
every connection's close, which made every micro-batch pay for its connections. A link
belongs to the process that made it: after a fork the child makes its own (`link`).
rstream's `Client` is used below its `Consumer`, so that a subscription ends without
closing its connection.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import logging
import os
import queue
import threading
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Iterator
from concurrent.futures import Future
from typing import Any, TypeVar

from ._core.stream_offsets import Range, RangeCursor
from ._stream_client import closed, discard, refused, rstream, unsubscribe

log = logging.getLogger("ackkit.spark.streams")
T = TypeVar("T")
MAX_SUBSCRIPTIONS = 200  # per connection: subscription ids are one byte; rstream's cap
CLOSE_WAIT = 2.0  # seconds a link may take to close at exit
CREDIT = 10  # chunks a read may have in flight
Sink = Callable[[int, int, bytes], Awaitable[None] | None]


class Link:
    """One process's connections to one broker (see the module doc). Its methods block
    the calling thread until the broker answered; they may be called from any thread
    but that of the link's own loop."""

    def __init__(self, conn: dict[str, Any]) -> None:
        self.conn = dict(conn)
        self.pid = os.getpid()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(
            target=self.loop.run_forever, name="ackkit-streams", daemon=True
        )
        self.thread.start()
        self._pool: Any = None
        self._locator: Any = None
        # broker address -> (data connection, its subscription ids in use)
        self._data: dict[Any, tuple[Any, set[int]]] = {}
        self._lock: asyncio.Lock | None = None

    # -- plumbing ------------------------------------------------------------------------

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        fut: Future[T] = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return fut.result()
        except BaseException:
            fut.cancel()
            raise

    def _pool_(self) -> Any:
        if self._pool is None:
            rs = rstream()
            c = self.conn
            self._pool = rs.client.ClientPool(
                c["host"],
                c.get("port", 5552),
                ssl_context=c.get("ssl_context"),
                vhost=c.get("vhost", "/"),
                username=c["username"],
                password=c["password"],
                frame_max=1024 * 1024,
                heartbeat=60,
                load_balancer_mode=False,
                max_retries=3,
            )
        return self._pool

    async def _locator_(self) -> Any:
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self._locator is None or not self._locator.is_connection_alive():
                if self._locator is not None:
                    await discard(self._locator)
                self._locator = await self._first_locator()
            return self._locator

    async def _first_locator(self) -> Any:
        """The locator connection to the first node that answers: the options' hosts
        in order (several node addresses), else the one host."""
        pool = self._pool_()
        hosts = list(dict.fromkeys(self.conn.get("hosts") or ()))
        if len(hosts) < 2:
            return await pool.new(
                connection_name="ackkit-stream:locator",
                addr=pool.addr,
                connection_closed_handler=closed,
            )
        port = self.conn.get("port", 5552)
        for i, host in enumerate(hosts):
            try:
                return await pool.new(
                    connection_name="ackkit-stream:locator",
                    addr=rstream().client.Addr(host, port),
                    connection_closed_handler=closed,
                )
            except (TimeoutError, OSError) as exc:
                if i == len(hosts) - 1:
                    raise
                log.warning(
                    "ackkit.spark: stream connection to %s:%s failed (%s); trying the next node",
                    host,
                    port,
                    f"{type(exc).__name__}: {exc}",
                )
        raise AssertionError("unreachable")  # pragma: no cover

    async def _data_for(self, stream: str) -> tuple[Any, set[int], int]:
        """A data connection to a node holding `stream` (a replica if there is one, as
        rstream's consumer reads), its ids in use, and a free subscription id on it
        (already counted as in use)."""
        locator = await self._locator_()
        try:
            leader, replicas = await locator.query_leader_and_replicas(stream)
        except rstream().exceptions.ServerError as exc:  # rstream's errors carry no text
            raise refused(stream, exc) from exc
        node = sorted(replicas, key=lambda b: (b.host, b.port))[0] if replicas else leader
        rs = rstream()
        addr = rs.client.Addr(node.host, node.port)
        assert self._lock is not None
        async with self._lock:
            client, used = self._data.get(addr, (None, set()))
            if client is None or not client.is_connection_alive():
                if client is not None:
                    await discard(client)
                client = await self._pool_().new(
                    connection_name="ackkit-stream:data",
                    addr=addr,
                    connection_closed_handler=closed,
                )
                used = set()
                self._data[addr] = (client, used)
            free = next((i for i in range(MAX_SUBSCRIPTIONS) if i not in used), None)
            if free is None:
                raise RuntimeError(f"more than {MAX_SUBSCRIPTIONS} stream subscriptions at once")
            used.add(free)
            return client, used, free

    @contextlib.asynccontextmanager
    async def _subscription(
        self,
        stream: str,
        spec: Any,
        credit: int,
        on_chunk: Callable[[Any, Any], Awaitable[None]],
    ) -> Any:
        """Subscribe to `stream` at `spec`; `on_chunk(connection, frame)` for each chunk
        delivered (from the first: chunks may come before `subscribe` returns). Yields
        the data connection; unsubscribes (the connection stays open)."""
        rs = rstream()
        client, used, sid = await self._data_for(stream)

        async def handler(frame: Any) -> None:
            if frame.subscription_id == sid:
                await on_chunk(client, frame)

        client.add_handler(rs.schema.Deliver, handler, name=str(sid))
        await client.run_queue_listener_task(subscriber_id=sid, handler=handler)
        try:
            offset_spec = rs.schema.OffsetSpec.from_params(spec.offset_type, spec.offset)
            try:
                await client.subscribe(
                    stream=stream,
                    subscription_id=sid,
                    offset_spec=offset_spec,
                    initial_credit=credit,
                )
            except rs.exceptions.ServerError as exc:
                raise refused(stream, exc) from exc
            yield client
        finally:
            # Its own task: a reader that stops early cancels the read, and the
            # cancellation must not cut the ending short (the id would stay taken).
            end = asyncio.ensure_future(unsubscribe(client, used, sid))
            await asyncio.shield(end)

    async def _close(self) -> None:
        for client in [*(c for c, _ in self._data.values()), self._locator]:
            if client is not None:
                await discard(client)
        self._data.clear()
        self._locator = None

    def close(self) -> None:
        """Close the connections and stop the loop (at exit; a later call opens anew)."""
        if self.pid != os.getpid() or not self.loop.is_running():
            return
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(self._close(), self.loop).result(CLOSE_WAIT)
        self.loop.call_soon_threadsafe(self.loop.stop)

    # -- what the source asks ------------------------------------------------------------

    def partitions(self, super_stream: str) -> list[str]:
        """The partition streams of a super stream, as the broker lists them."""

        async def go() -> list[str]:
            return list(await (await self._locator_()).partitions(super_stream))

        return self.call(go())

    def stream_exists(self, stream: str) -> bool:
        async def go() -> bool:
            return bool(await (await self._locator_()).stream_exists(stream))

        return self.call(go())

    def probe(
        self, streams: Iterable[str], kinds: Iterable[str], timeout: float, at: int | None = None
    ) -> list[dict[str, int]]:
        """Offsets per stream for each kind, from short subscriptions (all at once).

        kind "first": the first offset the stream holds; "tail": the offset after the
        last chunk's (the next offset to be written: a lower bound if the stream grows
        meanwhile); "timestamp": the first offset of the first chunk written at or after
        `at` (epoch ms). A stream that delivers nothing within `timeout` seconds is left
        out of its kind's answer (empty, or nothing at or after the timestamp)."""
        names, wanted = list(streams), list(kinds)
        return self.call(self._probe_all(names, wanted, timeout, at))

    async def _probe_all(
        self, names: list[str], kinds: list[str], timeout: float, at: int | None
    ) -> list[dict[str, int]]:
        answers: list[dict[str, int]] = [{} for _ in kinds]
        jobs = [
            self._probe_one(s, kind, timeout, at, answers[i])
            for i, kind in enumerate(kinds)
            for s in names
        ]
        for res in await asyncio.gather(*jobs, return_exceptions=True):
            if isinstance(res, BaseException):
                raise res
        return answers

    async def _probe_one(
        self, stream: str, kind: str, timeout: float, at: int | None, out: dict[str, int]
    ) -> None:
        rs = rstream()
        spec = {
            "first": rs.ConsumerOffsetSpecification(rs.OffsetType.FIRST, None),
            "tail": rs.ConsumerOffsetSpecification(rs.OffsetType.LAST, None),
            "timestamp": rs.ConsumerOffsetSpecification(rs.OffsetType.TIMESTAMP, at),
        }[kind]
        got = asyncio.Event()

        async def on_chunk(_client: Any, frame: Any) -> None:
            if not got.is_set():
                first = frame.chunk_first_offset
                out[stream] = first + frame.num_records if kind == "tail" else first
                got.set()

        async with self._subscription(stream, spec, 1, on_chunk):
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(got.wait(), timeout)

    def read_range(self, rng: Range, timeout: float, sink: Sink) -> RangeCursor:
        """Deliver every record of `rng` to `sink(offset, chunk_timestamp_ms, data)`, in
        offset order; returns the cursor (its `gaps`: offsets not delivered). A
        TimeoutError when nothing of the range came for `timeout` seconds; a
        ConnectionError when the connection is lost meanwhile."""
        return self.call(self._read(RangeCursor(rng), timeout, sink))

    def read_parts(
        self, cursor: RangeCursor, timeout: float, make: Callable[[int, int, bytes], T], size: int
    ) -> Iterator[list[T]]:
        """`read_range` of `cursor.range`, handed over while it is read: lists of up to
        `size` items, `make(offset, chunk_timestamp_ms, data)` of each record in offset
        order (made on the link's thread), so that the caller works on one part while
        the next is read. The read's error, if any, is raised after the parts before it;
        `cursor.gaps` is complete once the iterator is exhausted."""
        parts: queue.SimpleQueue[list[T] | None] = queue.SimpleQueue()
        pending: list[T] = []

        def sink(offset: int, ts: int, data: bytes) -> None:
            pending.append(make(offset, ts, data))
            if len(pending) >= size:
                parts.put(pending[:])
                pending.clear()

        def finished(_fut: Future[RangeCursor]) -> None:  # on the link's thread, last
            if pending:
                parts.put(pending[:])
            parts.put(None)

        fut = asyncio.run_coroutine_threadsafe(self._read(cursor, timeout, sink), self.loop)
        fut.add_done_callback(finished)
        try:
            while (part := parts.get()) is not None:
                yield part
            fut.result()
        finally:
            fut.cancel()

    async def _read(self, cursor: RangeCursor, timeout: float, sink: Sink) -> RangeCursor:
        rs = rstream()
        rng = cursor.range
        done = asyncio.Event()
        progress = asyncio.Event()
        failure: list[BaseException] = []

        async def on_chunk(client: Any, frame: Any) -> None:
            if done.is_set():
                return
            try:
                offset = frame.chunk_first_offset - 1
                for data in frame.get_messages():
                    offset += 1
                    if cursor.offer(offset):
                        maybe = sink(offset, frame.timestamp, bytes(data))
                        if maybe is not None:
                            await maybe
                    if cursor.done:
                        break
                if not cursor.done:  # one more chunk for this one
                    await client.credit(frame.subscription_id, 1)
            except BaseException as exc:  # surfaced by read_range
                failure.append(exc)
                done.set()
            progress.set()
            if cursor.done:
                done.set()

        spec = rs.ConsumerOffsetSpecification(rs.OffsetType.OFFSET, rng.first)
        async with self._subscription(rng.stream, spec, CREDIT, on_chunk) as client:
            quiet = 0.0
            while not done.is_set():
                progress.clear()
                try:
                    await asyncio.wait_for(progress.wait(), 1.0)
                    quiet = 0.0
                except TimeoutError:
                    quiet += 1.0
                    if not client.is_connection_alive():
                        raise ConnectionError(
                            f"stream {rng.stream!r}: the connection was lost while reading "
                            f"offsets {cursor.expected}..{rng.until - 1}"
                        ) from None
                    if quiet >= timeout:
                        raise TimeoutError(
                            f"stream {rng.stream!r}: no record of offsets {cursor.expected}.."
                            f"{rng.until - 1} came within {timeout:.0f} s"
                        ) from None
        if failure:
            raise failure[0]
        return cursor

    def store_offsets(self, reference: str, positions: dict[str, int]) -> None:
        """Store positions on the broker under `reference` (the last offset read:
        position-1)."""

        async def go() -> None:
            locator = await self._locator_()
            for stream, pos in positions.items():
                if pos > 0:
                    await locator.store_offset(stream=stream, reference=reference, offset=pos - 1)

        self.call(go())


_links: dict[tuple[Any, ...], Link] = {}
_links_lock = threading.Lock()


def link(conn: dict[str, Any]) -> Link:
    """This process's link for `conn` (made on first use, and again after a fork)."""
    key = tuple(sorted((k, repr(v)) for k, v in conn.items()))
    with _links_lock:
        found = _links.get(key)
        if found is None or found.pid != os.getpid() or not found.thread.is_alive():
            found = _links[key] = Link(conn)
        return found


@atexit.register
def _close_all() -> None:
    for lk in list(_links.values()):
        lk.close()
