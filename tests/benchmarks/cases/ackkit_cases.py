"""ackkit cases - STUBS until the runtimes exist.

How to fill one in (full protocol: module docstring of :mod:`tests.benchmarks.cases`):

1. Replace the stub body with a consumer that handles ``n`` messages from ``queue``
   with a no-op handler, acks them the ackkit way, closes cleanly and returns. Stop by
   yourself after ``n`` messages; use :class:`Watchdog` so a bug cannot hang the run.
2. Drop ``available=_not_written`` from the decorator (or replace it with a real
   check, e.g. "is Java installed" for Spark) and list the heavy modules you import
   in ``requires`` so the worker imports them before the clock starts.
3. Cases that need a special topology get ``setup=`` / ``check=`` / ``cleanup=`` hooks
   (see ``ackkit.deadletter`` below); helpers live in :mod:`tests.benchmarks.broker`.
4. Try it alone: ``python -m tests.benchmarks --quick --cases ackkit.sync.auto,pika.batched``.

The ratios the harness reports (and their targets) are:
``ackkit.sync.auto/pika.batched`` 0.8, ``ackkit.async.auto/aiopika.batched`` 0.9,
``ackkit.async.auto/faststream.default`` 5, ``ackkit.deadletter/publish.confirm`` 0.8,
``spark.ackkit/pika.batched`` 0.5.
"""

from __future__ import annotations

from . import CaseUnavailable, case


def _not_written() -> None:
    raise CaseUnavailable("stub, not written yet")


@case("ackkit.sync.auto", available=_not_written)
def ackkit_sync_auto(url: str, queue: str, n: int) -> None:
    """ackkit sync runtime (pika), automatic acknowledgement (batched by the core)."""
    _not_written()


@case("ackkit.sync.manual", available=_not_written)
def ackkit_sync_manual(url: str, queue: str, n: int) -> None:
    """ackkit sync runtime (pika), handler acks explicitly."""
    _not_written()


@case("ackkit.async.auto", available=_not_written)
def ackkit_async_auto(url: str, queue: str, n: int) -> None:
    """ackkit asyncio runtime (aio-pika), automatic acknowledgement."""
    _not_written()


@case("ackkit.async.manual", available=_not_written)
def ackkit_async_manual(url: str, queue: str, n: int) -> None:
    """ackkit asyncio runtime (aio-pika), handler acks explicitly."""
    _not_written()


# ackkit.deadletter: every message is poison and must end up in a dead-letter queue.
# Compared with publish.confirm because dead-lettering is a (broker-side) republish.
# When implementing, add hooks along these lines (names derived from `queue` so they
# are unique per run):
#
#   def _dl_setup(url, queue, n):
#       broker.declare_queue(url, queue + ".dlq")
#       broker.prefill(url, queue, n, arguments={
#           "x-dead-letter-exchange": "", "x-dead-letter-routing-key": queue + ".dlq"})
#   def _dl_check(url, queue, n):
#       return broker.check_drained(url, queue, n) or (
#           None if broker.queue_state(url, queue + ".dlq").ready == n else "DLQ count")
#   def _dl_cleanup(url, queue, n):
#       broker.delete_queue(url, queue); broker.delete_queue(url, queue + ".dlq")
#
#   @case("ackkit.deadletter", setup=_dl_setup, check=_dl_check, cleanup=_dl_cleanup)
@case("ackkit.deadletter", available=_not_written)
def ackkit_deadletter(url: str, queue: str, n: int) -> None:
    """ackkit dead-lettering of n poison messages into a DLQ."""
    _not_written()


# ackkit.retry.broker: broker-side bounded retry (retry queue with TTL / DLX back to the
# main queue). Needs setup/check/cleanup hooks like ackkit.deadletter.
@case("ackkit.retry.broker", available=_not_written)
def ackkit_retry_broker(url: str, queue: str, n: int) -> None:
    """ackkit broker-side retry: each message fails once, is retried, then acked."""
    _not_written()


# spark.ackkit: the Spark integration reading the queue; give it a larger timeout_s
# (JVM start-up) and an `available` hook that checks for pyspark and Java.
@case("spark.ackkit", available=_not_written)
def spark_ackkit(url: str, queue: str, n: int) -> None:
    """ackkit Spark integration draining the queue."""
    _not_written()
