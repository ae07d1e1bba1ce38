"""Crash injection for the crash tests: `ACKKIT_SPARK_CRASH=<point>:<n>` (tests only).

Points in the driver process (`n` is the batch id): `before_write`, `after_write` (the
writer returned, nothing acked yet), `after_ack` (acked, Spark's commit log not yet
written). The process SIGKILLs itself there. Point in the source runner (`n` counts the
batches it handed out, from 1): `wal_written` (the batch is in the write-ahead log, Spark
has not logged its offsets): the runner kills its whole process group.
"""

from __future__ import annotations

import os
import signal

ENV = "ACKKIT_SPARK_CRASH"


def crash_point(point: str, n: int, *, group: bool = False) -> None:
    spec = os.environ.get(ENV)
    if not spec:
        return
    name, _, num = spec.partition(":")
    if name != point or int(num or "0") != n:
        return
    if group:
        os.killpg(os.getpgrp(), signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)
