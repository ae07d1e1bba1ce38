"""Numeric connection options in an AMQP URL's query are checked when the app is built.

aiormq reads a value it cannot parse as 0 (`?heartbeat=abc` turned heartbeats off
without a word) and pika refused it only when connecting; now App, AsyncApp, pull
connections, the DLQ tool and the Spark source refuse it at once, naming the
parameter and never showing the password. No broker needed.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ackkit import App, AsyncApp
from ackkit._connection.url import _QUERY_NUMBERS, check_url

BUILDERS: dict[str, Callable[[str], Any]] = {"App": App, "AsyncApp": AsyncApp, "url": check_url}


def _acceptable(name: str, raw: str) -> bool:
    whole, lo, hi = _QUERY_NUMBERS[name]
    try:
        value = int(raw) if whole else float(raw)
    except ValueError:
        return False
    if not math.isfinite(value) or value < lo or (hi is not None and value > hi):
        return False
    return not (name in ("socket_timeout", "stack_timeout", "timeout") and value == lo)


values = (
    st.integers(-(2**40), 2**40).map(str)
    | st.floats(allow_nan=True, allow_infinity=True).map(repr)
    | st.text(max_size=8)
    | st.sampled_from(["", " 30", "1e3", "0x10", "²", "٣", "30s", "-0", "nan"])
)


@given(st.sampled_from(sorted(_QUERY_NUMBERS)), values, st.sampled_from(sorted(BUILDERS)))
def test_a_numeric_query_option_is_a_number_in_range_or_refused_by_name(
    name: str, raw: str, builder: str
) -> None:
    from urllib.parse import quote

    url = f"amqp://user:s3cret@localhost:5672/%2f?{name}={quote(raw)}"
    if _acceptable(name, raw):
        BUILDERS[builder](url)
        return
    with pytest.raises(ValueError) as err:
        BUILDERS[builder](url)
    assert f"url query parameter {name}" in str(err.value)
    assert "s3cret" not in str(err.value)


@pytest.mark.parametrize("builder", sorted(BUILDERS))
def test_other_query_parameters_are_left_to_the_client(builder: str) -> None:
    BUILDERS[builder]("amqp://localhost/%2f?name=svc&heartbeat=15&cafile=/x&auth=plain")


def test_pull_connections_and_the_dlq_tool_check_the_query_too() -> None:
    from ackkit import connect
    from ackkit.dead_letters._queue import DeadLetterQueue

    bad = "amqp://localhost/%2f?heartbeat=abc"
    with pytest.raises(ValueError, match="heartbeat"), connect(bad):
        pass
    with pytest.raises(ValueError, match="heartbeat"):
        DeadLetterQueue(bad, "q")


@pytest.mark.parametrize(
    "option,value,message",
    [
        ("url", "amqp://localhost/?frame_max=1", "frame_max"),
        ("max_batch", "abc", "max_batch must be an integer"),
        ("max_batch", "0", "max_batch must be >= 1"),
        ("prefetch", "-5", "prefetch must be between"),
        ("heartbeat", "70000", "heartbeat must be between 0 and 65535"),
        ("max_wait_ms", "soon", "max_wait_ms must be an integer"),
        ("linger_ms", "-1", "linger_ms must be between"),
        ("retain_batches", "1.5", "retain_batches must be an integer"),
    ],
)
def test_the_spark_source_names_a_bad_option(option: str, value: str, message: str) -> None:
    from ackkit.spark._options import SourceOptions

    opts = {"url": "amqp://localhost/", "queue": "q", "checkpoint": "/tmp/ck", option: value}
    with pytest.raises(ValueError, match=message):
        SourceOptions.parse(opts)
