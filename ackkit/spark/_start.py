"""start(): a streaming query's start, again when Spark's source runner missed its start-up.

Spark starts one Python process per Python source when a query starts (its
`python_streaming_source_runner`) and waits a fixed 10 s for it to connect back
(`PythonWorkerFactory.createSimpleWorker`, not configurable in Spark 4.3: the process
is built without the daemon, whatever `spark.python.use.daemon` says). On a machine too
busy to start a Python interpreter and import pyspark in that time, the query fails
while still initialising its sources, before any batch, with "Python worker failed to
connect back". Starting it again on the same checkpoint is the documented recovery from
any failure; here it is done at once for that one error, a bounded number of times.
"""

from __future__ import annotations

import logging
import time
from typing import Any

log = logging.getLogger("ackkit.spark")

CONNECT_BACK = "Python worker failed to connect back"
"""Spark's message (SparkException) when a Python worker it started did not connect in time."""
INITIALIZING = ("Initializing StreamExecution", "Initializing sources")
"""A query's status messages until its sources (and their runner processes) are up."""


def missed_start_up(error: object) -> bool:
    """Whether a query's error is Spark's Python worker missing its connect-back."""
    return error is not None and CONNECT_BACK in str(error)


def start(writer: Any, *, attempts: int = 3, init_timeout: float = 300.0, poll: float = 0.2) -> Any:
    """`writer.start()` (a `DataStreamWriter`, e.g. `df.writeStream.foreachBatch(...)
    .option("checkpointLocation", CKPT)`), waiting until the query's sources are up.

    When the query fails while initialising its sources with Spark's "Python worker
    failed to connect back" (the source runner did not start within Spark's fixed 10 s,
    on a busy machine), it is started again on its checkpoint, up to `attempts` starts in
    all. Any other failure, or the last attempt's, is left to the query as usual
    (`query.exception()`, `awaitTermination()`). Returns the query once its sources are
    initialised, or failed, or after `init_timeout` seconds still initialising."""
    if attempts < 1:
        raise ValueError(f"attempts must be at least 1, got {attempts}")
    for attempt in range(1, attempts + 1):
        query = writer.start()
        deadline = time.monotonic() + init_timeout
        while query.isActive and _initializing(query) and time.monotonic() < deadline:
            time.sleep(poll)
        if query.isActive or attempt == attempts:
            return query
        error = query.exception()
        if not missed_start_up(error):
            return query
        log.warning(
            "the streaming query failed while starting its sources (attempt %d of %d): "
            "%s; starting it again on its checkpoint",
            attempt,
            attempts,
            CONNECT_BACK,
        )
    raise AssertionError("unreachable")  # pragma: no cover


def _initializing(query: Any) -> bool:
    try:
        return str(query.status.get("message", "")) in INITIALIZING
    except Exception:  # the query ended meanwhile (Spark Connect may raise)
        return False
