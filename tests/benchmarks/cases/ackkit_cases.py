"""ackkit cases: the library's runtimes on the same workload as the raw anchors.

How to fill one in (full protocol: module docstring of :mod:`tests.benchmarks.cases`):

1. Replace the stub body with a consumer that handles ``n`` messages from ``queue``
   with a no-op handler, acks them the ackkit way, closes cleanly and returns. Stop by
   yourself after ``n`` messages; use :class:`Watchdog` so a bug cannot hang the run.
2. Give it an ``available`` hook only for a real precondition (e.g. a
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

import time
from collections.abc import Callable
from typing import Any

# module level: handler annotations are resolved at registration
from ackkit import Consumer, Delivery, Queue

from .. import broker as _broker
from . import CaseUnavailable, case


def _acked(stats: dict[str, int]) -> int:
    return stats.get("acked", 0)


@case("ackkit.sync.auto", requires=("ackkit", "pika"))
def ackkit_sync_auto(url: str, queue: str, n: int) -> None:
    """App (pika) with default settings, AUTO mode, a no-op handler."""
    from ackkit import App

    app = App(url, connection_name="bench-sync-auto")

    @app.listener(Queue(queue, declare=False))
    def noop(body: bytes) -> None:
        pass

    _run_app_until(app, n, _acked)


@case("ackkit.sync.manual", requires=("ackkit", "pika"))
def ackkit_sync_manual(url: str, queue: str, n: int) -> None:
    """App (pika), MANUAL mode: the handler acks each delivery (acks still batched)."""
    from ackkit import AckMode, App

    app = App(url, connection_name="bench-sync-manual")

    @app.listener(Queue(queue, declare=False), ack_mode=AckMode.MANUAL)
    def manual(d: Delivery) -> None:
        d.ack()

    _run_app_until(app, n, _acked)


def _amqp10_available() -> None:
    try:
        import proton  # noqa: F401
    except ImportError as exc:
        raise CaseUnavailable(f"python-qpid-proton missing: {exc}") from None


@case("ackkit.amqp10.auto", available=_amqp10_available, requires=("ackkit", "proton"))
def ackkit_amqp10_auto(url: str, queue: str, n: int) -> None:
    """App over AMQP 1.0 (python-qpid-proton; RabbitMQ 4.x), AUTO mode, a no-op handler."""
    from ackkit import App

    app = App(url, connection_name="bench-amqp10-auto", protocol="amqp1.0")

    @app.listener(Queue(queue, declare=False))
    def noop(body: bytes) -> None:
        pass

    try:
        _run_app_until(app, n, _acked)
    except Exception as exc:
        if "needs RabbitMQ 4.0" in str(exc):
            raise CaseUnavailable(str(exc)) from None
        raise


def _async_available() -> None:
    try:
        import aio_pika  # noqa: F401
    except ImportError as exc:
        raise CaseUnavailable(f"aio-pika missing: {exc}") from None


async def _run_async_app_until(app: Any, n: int) -> None:
    import asyncio

    from . import Watchdog

    watchdog = Watchdog(n)
    await app.start()
    try:
        while True:
            stats = next(iter(app.stats().values()), {})
            if _acked(stats) >= n:
                return
            count = stats.get("received", 0) + _acked(stats)
            if watchdog.stalled(count):
                raise watchdog.error(count)
            await asyncio.sleep(0.005)
    finally:
        await app.stop()


@case("ackkit.async.auto", available=_async_available, requires=("ackkit", "aio_pika"))
def ackkit_async_auto(url: str, queue: str, n: int) -> None:
    """AsyncApp (aio-pika) with default settings, AUTO mode, a no-op async handler."""
    import asyncio

    from ackkit import AsyncApp

    app = AsyncApp(url, connection_name="bench-async-auto")

    @app.listener(Queue(queue, declare=False))
    async def noop(body: bytes) -> None:
        pass

    asyncio.run(_run_async_app_until(app, n))


@case("ackkit.async.manual", available=_async_available, requires=("ackkit", "aio_pika"))
def ackkit_async_manual(url: str, queue: str, n: int) -> None:
    """AsyncApp (aio-pika), MANUAL mode: the handler awaits delivery.ack()."""
    import asyncio

    from ackkit import AckMode, AsyncApp

    app = AsyncApp(url, connection_name="bench-async-manual")

    @app.listener(Queue(queue, declare=False), ack_mode=AckMode.MANUAL)
    async def manual(d: Delivery) -> None:  # an AsyncDelivery arrives: ack is awaitable
        await d.ack()  # type: ignore[func-returns-value]

    asyncio.run(_run_async_app_until(app, n))


# ackkit.deadletter: every message is poison and must end up in a dead-letter queue.
# Compared with publish.confirm because ackkit's dead-lettering is a confirmed publish
# (to <queue>.dlq, with the error headers and traceback) followed by the ack of the
# original. The queue itself has no DLX: the DLQ copies are ackkit's, not the broker's.


def _dl_setup(url: str, queue: str, n: int) -> None:
    from ..broker import declare_queue, prefill

    declare_queue(url, queue + ".dlq")
    prefill(url, queue, n)


def _dl_check(url: str, queue: str, n: int) -> str | None:
    from ..broker import check_drained, queue_state

    problem = check_drained(url, queue, n)
    if problem:
        return problem
    dlq = queue_state(url, queue + ".dlq")
    if dlq is None or dlq.ready != n:
        return f"expected {n} messages in the DLQ, found {dlq.ready if dlq else 'no DLQ'}"
    return None


def _dl_cleanup(url: str, queue: str, n: int) -> None:
    from ..broker import delete_queue

    delete_queue(url, queue)
    delete_queue(url, queue + ".dlq")


class _Poison(Exception):
    """What the poison handler raises."""


def _run_app_until(app: Any, n: int, done: Callable[[dict[str, int]], int]) -> None:
    """Run `app` until done(stats) reaches n, then stop it (acks flushed, confirms awaited)."""
    from . import Watchdog

    watchdog = Watchdog(n)
    app.start()
    try:
        while True:
            stats = next(iter(app.stats().values()), {})
            count = done(stats)
            if count >= n:
                return
            # Progress is any handled delivery: a first pass that only fails or retries
            # must not look idle (ackkit.retry.broker acks nothing until attempt 2).
            progress = stats.get("received", 0) + count
            if watchdog.stalled(progress):
                raise watchdog.error(count)
            time.sleep(0.005)
    finally:
        app.stop()


@case(
    "ackkit.deadletter",
    setup=_dl_setup,
    check=_dl_check,
    cleanup=_dl_cleanup,
    requires=("ackkit", "pika"),
)
def ackkit_deadletter(url: str, queue: str, n: int) -> None:
    """ackkit dead-lettering of n poison messages into a DLQ."""
    from ackkit import App

    app = App(url, connection_name="bench-deadletter")

    @app.listener(Queue(queue, declare=False), consumer=Consumer(prefetch=1000))
    def poison(d: Delivery) -> None:
        raise _Poison("poison message")

    _run_app_until(app, n, lambda s: s.get("dead_lettered", 0))


# ackkit.retry.broker: broker-side bounded retry: each message fails once, is
# republished (confirmed) to the <queue>.retry.<ms>ms TTL queue, dead-letters back to
# the main queue and succeeds on attempt 2.

_RETRY_MS = 50


def _retry_cleanup(url: str, queue: str, n: int) -> None:
    from ..broker import delete_queue

    for name in (queue, queue + ".dlq", f"{queue}.retry.{_RETRY_MS}ms"):
        delete_queue(url, name)


def _retry_check(url: str, queue: str, n: int) -> str | None:
    from ..broker import check_drained, queue_state

    problem = check_drained(url, queue, n)
    if problem:
        return problem
    for name in (queue + ".dlq", f"{queue}.retry.{_RETRY_MS}ms"):
        state = queue_state(url, name)
        if state is not None and state.ready:
            return f"{state.ready} messages left in {name}"
    return None


@case(
    "ackkit.retry.broker",
    check=_retry_check,
    cleanup=_retry_cleanup,
    requires=("ackkit", "pika"),
)
def ackkit_retry_broker(url: str, queue: str, n: int) -> None:
    """ackkit broker-side retry: each message fails once, is retried, then acked."""
    from ackkit import App, Retry, RetryStrategy

    app = App(url, connection_name="bench-retry")
    retry = Retry(max_attempts=2, initial_interval=_RETRY_MS / 1000, strategy=RetryStrategy.BROKER)

    @app.listener(Queue(queue, declare=False), consumer=Consumer(prefetch=1000), retry=retry)
    def flaky(d: Delivery) -> None:
        if d.attempt == 1:
            raise _Poison("fails once")

    _run_app_until(app, n, lambda s: s.get("acked", 0))


def _spark_available() -> None:
    """Java and pyspark present; then start Spark and warm the JVM (not timed)."""
    import os
    import shutil
    import sys

    if shutil.which("java") is None:
        raise CaseUnavailable("no Java on PATH")
    try:
        import pyspark  # noqa: F401
    except ImportError as exc:
        raise CaseUnavailable(f"pyspark missing: {exc}") from None
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from spark.bench import warm

    warm(os.environ["ACKKIT_BENCH_URL"])


@case("spark.ackkit", available=_spark_available, timeout_s=1200, requires=("ackkit", "pika"))
def spark_ackkit(url: str, queue: str, n: int) -> None:
    """Spark Structured Streaming: the rabbitmq source to Parquet, acked after each write."""
    from spark.bench import run_case

    run_case(url, queue, n)


def _spark_steady_setup(url: str, queue: str, n: int) -> None:
    from spark.bench import prefill

    prefill(url, queue, n)  # with message ids, as the source deduplicates by them


@case(
    "spark.ackkit.steady",
    available=_spark_available,
    setup=_spark_steady_setup,
    timeout_s=1200,
    requires=("ackkit", "pika"),
)
def spark_ackkit_steady(url: str, queue: str, n: int) -> dict[str, float]:
    """Spark source to Parquet, one queue: the steady state after the first batch."""
    from spark.bench import run_steady

    return run_steady(url, queue, n)


def _shard_cases(shards: int) -> None:
    def setup(url: str, queue: str, n: int) -> None:
        from spark.bench import prefill_shards

        prefill_shards(url, queue, shards, n)

    def check(url: str, queue: str, n: int) -> str | None:
        from ackkit.shards import shard_queues

        for q in shard_queues(queue, shards):
            problem = _broker.check_drained(url, q, n)
            if problem:
                return f"{q}: {problem}"
        return None

    def cleanup(url: str, queue: str, n: int) -> None:
        from ackkit.shards import shard_queues

        for q in shard_queues(queue, shards):
            _broker.delete_queue(url, q)

    def run(url: str, queue: str, n: int) -> dict[str, float]:
        from ackkit.shards import shard_queues
        from spark.bench import run_steady

        return run_steady(url, list(shard_queues(queue, shards)), n)

    run.__doc__ = f"Spark source, {shards} shard queue(s) read in parallel: steady state."
    case(
        f"spark.ackkit.steady.shards{shards}",
        available=_spark_available,
        setup=setup,
        check=check,
        cleanup=cleanup,
        timeout_s=1200,
        requires=("ackkit", "pika"),
    )(run)


# The queue source on 1, 2 and 4 client-routed shard queues (ratios to pika.batched in
# harness.RATIOS). Another Spark source (e.g. a streams source) registers its own steady
# cases after these, as spark.<source>.steady..., with a setup of its own.
for _n in (1, 2, 4):
    _shard_cases(_n)
