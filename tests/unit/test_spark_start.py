"""aks.start(): a query whose source runner missed Spark's connect-back is started again
(scripted queries; the real one is tests/spark/test_spark_slow_worker.py)."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("pyspark")

from ackkit.spark import start
from ackkit.spark._start import CONNECT_BACK

MISSED = (
    "[STREAM_FAILED] Query [id = 1, runId = 2] terminated with exception: "
    f"{CONNECT_BACK}. SQLSTATE: XXKST"
)


class Query:
    """A started query as Spark reports it: initialising for `polls` polls, then active
    (error None) or failed with `error`."""

    def __init__(self, error: str | None, polls: int = 2) -> None:
        self.error = error
        self.polls = polls

    @property
    def isActive(self) -> bool:
        return self.polls > 0 or self.error is None

    @property
    def status(self) -> dict[str, Any]:
        if self.polls > 0:
            self.polls -= 1
            return {"message": "Initializing sources"}
        return {"message": "Waiting for data to arrive"}

    def exception(self) -> str | None:
        return None if self.isActive else self.error


class Writer:
    """A DataStreamWriter whose starts fail with the given errors, in order."""

    def __init__(self, *errors: str | None) -> None:
        self.errors = list(errors)
        self.started: list[Query] = []

    def start(self) -> Query:
        self.started.append(Query(self.errors.pop(0)))
        return self.started[-1]


def test_a_missed_connect_back_starts_the_query_again() -> None:
    w = Writer(MISSED, MISSED, None)
    q = start(w, poll=0)
    assert len(w.started) == 3
    assert q is w.started[-1] and q.isActive


def test_the_attempts_are_bounded_and_the_last_failure_is_the_querys() -> None:
    w = Writer(MISSED, MISSED, MISSED, None)
    q = start(w, attempts=3, poll=0)
    assert len(w.started) == 3
    assert not q.isActive and CONNECT_BACK in str(q.exception())


def test_another_error_is_not_retried() -> None:
    w = Writer("[STREAM_FAILED] ... AMQPConnectionError: connection refused", None)
    q = start(w, poll=0)
    assert len(w.started) == 1
    assert "connection refused" in str(q.exception())


def test_a_query_already_running_is_returned_after_one_start() -> None:
    w = Writer(None)
    assert start(w, poll=0) is w.started[0]
    with pytest.raises(ValueError, match="attempts"):
        start(Writer(None), attempts=0)
