"""What the stream link needs of rstream 1.1.1's `Client`, with its quirks handled: the
import (an optional extra), a lost connection's socket, errors without text, and
ending one subscription on a connection that stays open."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

log = logging.getLogger("ackkit.spark.streams")


def rstream() -> Any:
    try:
        import rstream
        import rstream.client
        import rstream.schema
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(
            "the rabbitmq-stream source needs rstream: pip install 'ackkit[streams]'"
        ) from exc
    return rstream


def closed(info: Any) -> None:
    # rstream logs a traceback for a lost connection that has no handler (it calls a
    # handler only for connections that carry stream names, which ours never do). A lost
    # connection is found by the next call (a new one is opened) or by a read in progress
    # (ConnectionError).
    log.info("ackkit.spark: stream connection closed: %s", info)


async def discard(client: Any) -> None:
    """Let go of a connection the broker closed: its tasks and its socket (rstream's
    close() leaves the socket of a broken connection open)."""
    conn = getattr(client, "_conn", None)
    with contextlib.suppress(Exception):
        await client.close()
    writer = getattr(conn, "_writer", None)
    if writer is not None:
        with contextlib.suppress(Exception):
            writer.close()
            await asyncio.wait_for(writer.wait_closed(), 1)


def refused(stream: str, exc: Exception) -> Exception:
    """rstream's error for `stream` with words: a LookupError when it does not exist."""
    rs = rstream()
    if isinstance(exc, rs.exceptions.StreamDoesNotExist):
        return LookupError(f"stream {stream!r} does not exist on the broker")
    return RuntimeError(f"stream {stream!r}: the broker refused ({type(exc).__name__})")


async def unsubscribe(client: Any, used: set[int], sid: int) -> None:
    """End subscription `sid` on `client` and free its id (whatever fails on the way)."""
    rs = rstream()
    with contextlib.suppress(Exception):
        if client.is_connection_alive():
            await asyncio.wait_for(client.unsubscribe(sid), 5)
    with contextlib.suppress(Exception):
        await client.stop_queue_listener_task(subscriber_id=sid)
    with contextlib.suppress(Exception):
        client.remove_handler(rs.schema.Deliver, name=str(sid))
    used.discard(sid)
