"""Metrics, tracing and log context against a real broker (issue 8).

The numbers a scrape shows are checked against what the broker shows: the
queue drained, the dead-letter queue's depth, nothing left unacked.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from _retry_support import drain, header_text, publish, wait_until

import ackkit
from ackkit import App, AsyncApp, Consumer, DeadLetterMessage, Delivery, Retry

pytestmark = pytest.mark.integration
prometheus_client = pytest.importorskip("prometheus_client")

REPO = Path(__file__).resolve().parents[2]
N = 200  # n % 10 == 0: dead-lettered at once; n % 10 == 3: fails once, acked on its retry


def _outcome(n: int, calls: dict[int, int]) -> None:
    calls[n] = calls.get(n, 0) + 1
    if n % 10 == 0:
        raise DeadLetterMessage(f"order {n} is poison")
    if n % 10 == 3 and calls[n] == 1:
        raise ConnectionError(f"order {n}: the database blinked")


def _run(app: Any, body: Callable[[], None]) -> None:
    """Run `app` (App or AsyncApp) around `body` (blocking code), then stop it gracefully."""
    if isinstance(app, App):
        with app.running():
            body()
        return

    async def main() -> None:
        async with app.running():
            await asyncio.to_thread(body)

    asyncio.run(main())


def _make_app(kind: str, url: str, queue: str, calls: dict[int, int]) -> Any:
    retry = Retry(max_attempts=3, initial_interval=0.1)
    if kind == "sync":
        app = App(url, shutdown_timeout=5)

        @app.listener(queue, consumer=Consumer(prefetch=50), retry=retry, name="orders")
        def handle(order: dict[str, int]) -> None:
            _outcome(order["n"], calls)

        return app
    aapp = AsyncApp(url, shutdown_timeout=5)

    @aapp.listener(queue, consumer=Consumer(prefetch=50), retry=retry, name="orders")
    async def ahandle(order: dict[str, int]) -> None:
        _outcome(order["n"], calls)

    return aapp


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_scraped_counters_match_what_the_broker_shows(
    rabbitmq: Any, fresh_queue: str, kind: str
) -> None:
    from ackkit.metrics import PrometheusMetrics

    q, dlq = fresh_queue, f"{fresh_queue}.dlq"
    calls: dict[int, int] = {}
    app = _make_app(kind, rabbitmq.url, q, calls)
    registry = prometheus_client.CollectorRegistry()
    metrics = PrometheusMetrics(app, registry=registry)
    labels = {"listener": "orders", "queue": q}
    failing = N // 10
    dead = N // 10
    scraped: dict[str, float] = {}

    def value(name: str, **more: str) -> float:
        got = registry.get_sample_value(name, {**labels, **more})
        return 0.0 if got is None else got

    def body() -> None:
        server = metrics.serve(0, "127.0.0.1")
        try:
            with ackkit.connect(rabbitmq.url) as c:
                for n in range(N):
                    c.publish(q, json.dumps({"n": n}), message_id=f"o-{n}")
            handled = N + failing
            assert wait_until(lambda: sum(calls.values()) >= handled, timeout=30), calls
            rabbitmq.wait_for(dlq, ready=dead, timeout=15)
            rabbitmq.wait_for(q, ready=0, unacked=0, timeout=15)
            assert wait_until(lambda: value("ackkit_acked_total") >= N - dead, timeout=10)
            port = server.port
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
                text = r.read().decode()
            scraped["http_has_acked"] = float('ackkit_acked_total{listener="orders"' in text)
        finally:
            server.close()

    _run(app, body)

    assert scraped["http_has_acked"] == 1.0
    # what the broker shows: everything settled, the DLQ holds exactly the dead letters
    rabbitmq.wait_for(q, ready=0, unacked=0, consumers=0)
    dlq_depth = rabbitmq.counts(dlq).ready
    assert dlq_depth == dead
    assert value("ackkit_dead_lettered_total") == dlq_depth
    assert value("ackkit_delivered_total") == N + failing  # retry copies are deliveries too
    assert value("ackkit_retried_total") == failing
    assert value("ackkit_acked_total") == N - dead
    for name in ("requeued", "rejected", "unsettled", "stale_dropped", "returned", "nacked"):
        assert value(f"ackkit_{name}_total") == 0, name
    assert value("ackkit_in_flight") == 0
    assert value("ackkit_pending_acks") == 0
    assert value("ackkit_republishing") == 0
    # every original was acked by some frame: the handled ones, the retried and the dead
    assert value("ackkit_ack_batch_size_sum") == N + failing
    frames = value("ackkit_ack_batch_size_count")
    assert 1 <= frames < N + failing  # batched
    assert value("ackkit_handler_duration_seconds_count", outcome="ok") == N - dead
    assert value("ackkit_handler_duration_seconds_count", outcome="error") == dead + failing
    assert sorted(int(p.message_id[2:]) for p, _ in drain(rabbitmq.url, dlq)) == [
        n for n in range(N) if n % 10 == 0
    ]


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_one_trace_from_publish_through_retries_to_the_dlq(
    rabbitmq: Any, fresh_queue: str, kind: str
) -> None:
    sdk_trace = pytest.importorskip("opentelemetry.sdk.trace")
    from opentelemetry import propagate, trace
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from ackkit.tracing import OpenTelemetryTracing

    q, dlq = fresh_queue, f"{fresh_queue}.dlq"
    exporter = InMemorySpanExporter()
    provider = sdk_trace.TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    retry = Retry(max_attempts=3, initial_interval=0.1)
    app: Any
    if kind == "sync":
        app = App(rabbitmq.url, shutdown_timeout=5)

        @app.listener(q, retry=retry, name="orders")
        def handle(d: Delivery) -> None:
            with tracer.start_as_current_span("charge card"):
                raise ConnectionError("card service down")

    else:
        app = AsyncApp(rabbitmq.url, shutdown_timeout=5)

        @app.listener(q, retry=retry, name="orders")
        async def ahandle(body: bytes) -> None:
            with tracer.start_as_current_span("charge card"):
                await asyncio.sleep(0)
                raise ConnectionError("card service down")

    OpenTelemetryTracing(app, tracer_provider=provider)
    with tracer.start_as_current_span("place order", kind=trace.SpanKind.PRODUCER) as producer:
        headers: dict[str, str] = {}
        propagate.inject(headers)

    def body() -> None:
        publish(rabbitmq.url, q, b"{}", message_id="o-1", headers=headers)
        rabbitmq.wait_for(dlq, ready=1, timeout=15)

    _run(app, body)
    ((props, _),) = drain(rabbitmq.url, dlq)

    spans = exporter.get_finished_spans()
    trace_id = producer.get_span_context().trace_id
    assert {s.context.trace_id for s in spans} == {trace_id}, "one trace"
    process = [s for s in spans if s.name == f"process {q}"]
    assert len(process) == 3
    # each attempt is the child of the one before (its copy carried the context on)
    parents = [s.parent.span_id if s.parent else None for s in process]
    assert parents[0] == producer.get_span_context().span_id
    assert parents[1:] == [s.context.span_id for s in process[:2]]
    assert [s.attributes["ackkit.attempt"] for s in process if s.attributes] == [1, 2, 3]
    assert all(s.status.status_code is trace.StatusCode.ERROR for s in process)
    work = [s for s in spans if s.name == "charge card"]
    assert [s.parent.span_id for s in work if s.parent] == [s.context.span_id for s in process]
    # the dead letter continues the trace from the last attempt's span
    carried = header_text(props.headers["traceparent"]).split("-")
    assert carried[1] == format(trace_id, "032x")
    assert carried[2] == format(process[-1].context.span_id, "016x")


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_failure_and_dead_letter_lines_carry_the_delivery_context(
    rabbitmq: Any, fresh_queue: str, kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    q = fresh_queue
    calls: dict[int, int] = {}
    app = _make_app(kind, rabbitmq.url, q, calls)
    caplog.set_level(logging.INFO, logger="ackkit")

    def body() -> None:
        publish(rabbitmq.url, q, json.dumps({"n": 3}), message_id="o-3")
        publish(rabbitmq.url, q, json.dumps({"n": 10}), message_id="o-10")
        rabbitmq.wait_for(f"{q}.dlq", ready=1, timeout=15)
        assert wait_until(lambda: calls.get(3) == 2, timeout=10)

    _run(app, body)
    rows = [
        (r.outcome, r.message_id, r.attempt, r.listener, r.queue)
        for r in caplog.records
        if hasattr(r, "outcome")
    ]
    assert ("failed", "o-3", 1, "orders", q) in rows
    assert ("failed", "o-10", 1, "orders", q) in rows
    assert ("dead_lettered", "o-10", 1, "orders", q) in rows
    assert not any(o == "dead_lettered" and m == "o-3" for o, m, *_ in rows)
    for r in caplog.records:
        assert "guest:guest@" not in r.getMessage()


APP_MODULE = """
import os
from ackkit import App, Consumer

app = App(os.environ["T_URL"], shutdown_timeout=5)

@app.listener(os.environ["T_QUEUE"], consumer=Consumer(prefetch=20), name="svc")
def handle(body: bytes) -> None:
    pass
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def test_ackkit_run_serves_metrics(rabbitmq: Any, fresh_queue: str, tmp_path: Path) -> None:
    q = fresh_queue
    (tmp_path / "msvc.py").write_text(APP_MODULE)
    port = _free_port()
    env = {**os.environ, "T_URL": rabbitmq.url, "T_QUEUE": q, "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "ackkit.cli", "run", "msvc:app"]
    cmd += ["--metrics-port", str(port), "--metrics-addr", "127.0.0.1"]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stderr=subprocess.PIPE, text=True)

    def acked() -> float | None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                text = r.read().decode()
        except OSError:
            return None
        for line in text.splitlines():
            if line.startswith('ackkit_acked_total{listener="svc"'):
                return float(line.rsplit(" ", 1)[1])
        return None

    try:
        assert wait_until(lambda: acked() is not None, timeout=30), "no metrics endpoint"
        rabbitmq.wait_for(q, consumers=1, timeout=30)  # declared and consuming
        with ackkit.connect(rabbitmq.url) as c:
            for i in range(30):
                c.publish(q, b"x", message_id=f"m{i}")
        assert wait_until(lambda: acked() == 30, timeout=15)
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert f"metrics on http://127.0.0.1:{port}/metrics" in err
    rabbitmq.wait_for(q, ready=0, unacked=0, consumers=0)


def _counting(n: int, done: threading.Event) -> Callable[[bytes], None]:
    count = [0]

    def handle(body: bytes) -> None:
        count[0] += 1
        if count[0] == n:
            done.set()

    return handle


@pytest.mark.bench
def test_metrics_overhead_is_small(rabbitmq: Any, queue_factory: Any) -> None:
    """The same drain with and without metrics, printed for the record (`pytest -m bench -s
    tests/integration/test_observability.py`). A benchmark, not part of `make test`: on a
    shared 2-core machine wall-clock ratios swing by 3x either way. The per-message cost
    of metrics is the handler probe alone (two clock reads, one histogram observation)."""
    from ackkit.metrics import PrometheusMetrics

    n = 3000
    took: dict[bool, list[float]] = {False: [], True: []}
    for on in (False, True, False, True):
        q = queue_factory(f"m{int(on)}")
        with ackkit.connect(rabbitmq.url) as c:
            c.declare_queue(q)
            for _ in range(n):
                c.publish(q, b"x", persistent=False, content_type=None)
        app = App(rabbitmq.url)
        done = threading.Event()

        app.listener(q, consumer=Consumer(prefetch=250))(_counting(n, done))

        if on:
            PrometheusMetrics(app, registry=prometheus_client.CollectorRegistry())
        app.start()
        t0 = time.perf_counter()
        assert done.wait(60)
        took[on].append(time.perf_counter() - t0)
        app.stop()
    off_us = min(took[False]) / n * 1e6
    on_us = min(took[True]) / n * 1e6
    print(f"drain of {n}: {off_us:.1f} us/msg without metrics, {on_us:.1f} us/msg with")
    assert on_us < off_us * 3 + 100  # only a gross regression fails
