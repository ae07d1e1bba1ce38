"""Spark tests: one local SparkSession for the whole run, started on first use."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

# The repo root, so that `spark` is the pipeline package at the top of the repo (this
# directory has no __init__.py on purpose: as a package it would be called `spark` too).
ROOT = str(Path(__file__).resolve().parents[2])
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


def _java() -> bool:
    return shutil.which("java") is not None


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    if not _java():
        pytest.skip("Spark tests need Java (a JRE 17 on PATH)")
    pytest.importorskip("pyspark")
    from spark.orders_pipeline import spark_session

    session = spark_session("ackkit-tests")
    yield session
    session.stop()
