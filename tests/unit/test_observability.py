"""Metrics, tracing and log context on the core and the runtime-neutral hooks, no broker."""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ackkit import App, Consumer, DeadLetterMessage, Delivery, Retry
from ackkit._app.spec import ListenerSpec, probe_for
from ackkit._core.actions import Republish
from ackkit._core.events import FRAME_BUCKETS
from ackkit._core.listener import ListenerCore
from ackkit._core.policy import FlushPolicy, ListenerPolicy
from ackkit._telemetry.logs import FailureLog
from ackkit.observability import Event, Stage


class _Settler:
    def settle(self, delivery: Delivery, kind: str, requeue: bool, multiple: bool) -> None:
        raise AssertionError("not settled by hand in these tests")


def delivery(core: ListenerCore, tag: int, **props: Any) -> Delivery:
    t = core.receive(tag, headers=props.get("headers"), message_id=props.get("message_id"))
    p = SimpleNamespace(headers=props.get("headers"), message_id=props.get("message_id"))
    return Delivery(b"{}", p, t, _Settler(), queue=core.policy.queue, routing_key="q")


def started(app: App) -> tuple[ListenerSpec, ListenerCore, Any]:
    """What a runtime does at start: build the core with the app's observer, instrument it."""
    spec = app.specs[0]
    c = ListenerCore(spec.policy, observer=app._observer(), wallclock=lambda: 0.0)
    probe = probe_for(app._run_instruments(), spec, c)
    c.channel_opened()
    return spec, c, probe


# -- core: what observers and counters see ----------------------------------------------


def confirm(c: ListenerCore, acts: list[Any]) -> None:
    """The broker confirms every copy in `acts`."""
    for a in acts:
        if isinstance(a, Republish):
            c.republished(a.token, True)


def test_an_observer_that_is_not_hot_sees_no_healthy_message() -> None:
    seen: list[Event] = []

    class Failures:
        hot = False

        def __call__(self, ev: Event) -> None:
            seen.append(ev)

    c = ListenerCore(ListenerPolicy(name="l", queue="q"), observer=Failures())
    c.channel_opened()
    for tag in range(1, 101):
        c.finish(c.receive(tag, message_id=f"m{tag}"))
    assert seen == []
    t = c.receive(101, message_id="poison")
    (copy,) = c.finish(t, DeadLetterMessage("bad"))
    assert seen == []  # not dead-lettered until the broker confirms the copy
    assert isinstance(copy, Republish)
    c.republished(copy.token, True)
    assert [(e.stage, e.message_id, e.reason) for e in seen] == [
        (Stage.DEAD_LETTERED, "poison", "bad")
    ]
    assert c.counters.counts[Stage.RECEIVED] == 101  # counted all the same


def test_a_plain_observer_still_sees_every_stage_with_the_message_id() -> None:
    seen: list[Event] = []
    c = ListenerCore(ListenerPolicy(name="l", queue="q"), observer=seen.append)
    c.channel_opened()
    c.finish(c.receive(1, message_id="m-1"))
    assert [(e.stage, e.message_id) for e in seen] == [
        (Stage.RECEIVED, "m-1"),
        (Stage.ACKED, "m-1"),
    ]


def test_ack_frame_sizes_are_kept_as_a_histogram() -> None:
    c = ListenerCore(
        ListenerPolicy(
            name="l", queue="q", prefetch=100, flush=FlushPolicy(max_pending=10, interval=60.0)
        ),
    )
    c.channel_opened()
    ts = [c.receive(tag) for tag in range(1, 31)]
    for t in ts[:25]:
        c.finish(t)  # two frames of 10 deliveries
    c.finish(ts[26])  # 26 settles behind 25 (still in a handler)
    c.drain()  # 21..25 as one frame, 27 alone
    counters = c.counters
    assert counters.ack_frames == 4
    assert counters.acked_by_frames == 26
    by_bound = dict(zip(FRAME_BUCKETS, counters.frame_sizes, strict=False))
    assert by_bound[1] == 1 and by_bound[5] == 1 and by_bound[10] == 2
    assert sum(counters.frame_sizes) == 4


def test_carried_headers_go_on_every_republished_copy_but_never_override_ackkit_ones() -> None:
    c = ListenerCore(
        ListenerPolicy(name="l", queue="q", retry=Retry(max_attempts=2, initial_interval=0.1)),
        wallclock=lambda: 0.0,
    )
    c.channel_opened()
    t = c.receive(1)
    t.carry = {"traceparent": "00-abc-def-01", "ackkit-attempt": 99}
    (retry,) = c.finish(t, ValueError("x"))
    assert isinstance(retry, Republish) and retry.purpose == "retry"
    assert retry.set_headers["traceparent"] == "00-abc-def-01"
    assert retry.set_headers["ackkit-attempt"] == 2
    t2 = c.receive(2, headers={"ackkit-attempt": 2})
    t2.carry = {"traceparent": "00-abc-xyz-01"}
    (dead,) = c.finish(t2, ValueError("x"))
    assert isinstance(dead, Republish) and dead.purpose == "dead-letter"
    assert dead.set_headers["traceparent"] == "00-abc-xyz-01"


def test_a_retry_later_to_a_new_delay_queue_keeps_the_carried_headers() -> None:
    from ackkit import RetryLater

    c = ListenerCore(
        ListenerPolicy(name="l", queue="q", retry=Retry(max_attempts=3, initial_interval=0.1)),
        wallclock=lambda: 0.0,
    )
    c.channel_opened()
    t = c.receive(1)
    t.carry = {"traceparent": "tp"}
    (act,) = c.finish(t, RetryLater("later", delay=7.0))
    assert isinstance(act, Republish) and act.declare is not None
    assert act.set_headers["traceparent"] == "tp"


# -- logging ------------------------------------------------------------------------------


def test_dead_letter_unsettled_stale_lines_carry_structured_context(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from ackkit import AckMode

    app = App("amqp://alice:s3cret@example.invalid/%2f")

    @app.listener("orders", ack_mode=AckMode.MANUAL, name="orders-l")
    def handle(d: Delivery) -> None: ...

    _, c, _ = started(app)
    caplog.set_level(logging.INFO, logger="ackkit")
    poison = c.receive(1, message_id="m-1")
    confirm(c, c.finish(poison, DeadLetterMessage("cannot parse amqp://alice:s3cret@db.example/x")))
    forgot = c.receive(2, message_id="m-2")
    confirm(c, c.finish(forgot))  # MANUAL: returned without settling
    late = c.receive(3, message_id="m-3")
    c.channel_closed()
    c.channel_opened()
    c.finish(late)  # its channel is gone

    lines = [(r.outcome, r.message_id) for r in caplog.records if hasattr(r, "outcome")]
    assert lines == [
        ("dead_lettered", "m-1"),
        ("unsettled", "m-2"),
        ("dead_lettered", "m-2"),  # on_unsettled's default
        ("stale_dropped", "m-3"),
    ]
    by_outcome = {r.outcome: r for r in caplog.records if hasattr(r, "outcome")}
    dead = next(r for r in caplog.records if getattr(r, "outcome", "") == "dead_lettered")
    assert (dead.listener, dead.queue, dead.message_id, dead.attempt) == (
        "orders-l",
        "orders",
        "m-1",
        1,
    )
    assert dead.levelno == logging.WARNING and dead.delivery_tag == 1
    assert by_outcome["unsettled"].message_id == "m-2"
    assert by_outcome["stale_dropped"].message_id == "m-3"
    assert by_outcome["stale_dropped"].levelno == logging.INFO
    text = "\n".join(r.getMessage() + str(getattr(r, "reason", "")) for r in caplog.records)
    assert "s3cret" not in text and "m-1" in text


def test_lifecycle_lines_are_throttled_per_kind(caplog: pytest.LogCaptureFixture) -> None:
    app = App()

    @app.listener("q")
    def handle(body: bytes) -> None: ...

    _, c, _ = started(app)
    caplog.set_level(logging.INFO, logger="ackkit")
    for tag in range(1, 51):
        confirm(c, c.finish(c.receive(tag), DeadLetterMessage("poison")))
    lines = [r for r in caplog.records if getattr(r, "outcome", "") == "dead_lettered"]
    assert 1 <= len(lines) <= 20  # 10 a second


def test_failure_line_has_the_delivery_context(caplog: pytest.LogCaptureFixture) -> None:
    c = ListenerCore(ListenerPolicy(name="l", queue="q"))
    c.channel_opened()
    d = delivery(c, 7, message_id="m-7")
    with caplog.at_level(logging.WARNING, logger="ackkit.test"):
        FailureLog(logging.getLogger("ackkit.test")).failed("l", d, KeyError("k"))
    (r,) = caplog.records
    assert (r.listener, r.queue, r.message_id, r.attempt, r.outcome, r.error_type) == (
        "l",
        "q",
        "m-7",
        1,
        "failed",
        "KeyError",
    )


# -- instrumentation hooks ---------------------------------------------------------------


def test_no_instrument_means_no_probe() -> None:
    app = App()

    @app.listener("q")
    def handle(body: bytes) -> None: ...

    assert started(app)[2] is None


def test_prometheus_metrics_read_the_core_at_scrape_time() -> None:
    prometheus_client = pytest.importorskip("prometheus_client")
    from ackkit.metrics import PrometheusMetrics

    app = App()

    @app.listener("orders", name="o", consumer=Consumer(prefetch=10))
    def handle(body: bytes) -> None: ...

    registry = prometheus_client.CollectorRegistry()
    metrics = PrometheusMetrics(app, registry=registry)
    _, c, probe = started(app)
    assert probe is not None
    for tag in range(1, 6):
        d = delivery(c, tag)
        done = probe((d,))
        done(None if tag < 5 else DeadLetterMessage("no"))
        c.finish(d._tracked, None if tag < 5 else DeadLetterMessage("no"))
    c.receive(6)  # in flight
    c.drain()

    def value(name: str, **labels: str) -> float:
        got = registry.get_sample_value(name, {"listener": "o", "queue": "orders", **labels})
        assert got is not None, name
        return got

    assert value("ackkit_delivered_total") == 6
    assert value("ackkit_acked_total") == 4
    assert value("ackkit_dead_lettered_total") == 0  # counted once the broker confirms it
    assert value("ackkit_retried_total") == 0
    assert value("ackkit_in_flight") == 1
    assert value("ackkit_republishing") == 1  # the dead letter awaits its confirm
    assert value("ackkit_ack_batch_size_count") == 1
    assert value("ackkit_ack_batch_size_sum") == 4
    assert value("ackkit_ack_batch_size_bucket", le="5.0") == 1
    assert value("ackkit_handler_duration_seconds_count", outcome="ok") == 4
    assert value("ackkit_handler_duration_seconds_count", outcome="error") == 1
    names = {n for n, _, _ in metrics.samples()}
    assert "ackkit_stale_dropped_total" in names and "ackkit_returned_total" in names
    metrics.close()
    assert registry.get_sample_value("ackkit_delivered_total", {"listener": "o"}) is None
    assert app._instruments == []


def test_prometheus_counters_never_go_down() -> None:
    """TRANSACTED rolls settled acks back into requeues: the acked counter holds its value."""
    prometheus_client = pytest.importorskip("prometheus_client")
    from ackkit.metrics import PrometheusMetrics

    app = App()

    @app.listener("q", name="l")
    def handle(body: bytes) -> None: ...

    registry = prometheus_client.CollectorRegistry()
    PrometheusMetrics(app, registry=registry)
    _, c, _ = started(app)
    c.counters.counts[Stage.ACKED] = 5
    assert registry.get_sample_value("ackkit_acked_total", {"listener": "l", "queue": "q"}) == 5
    c.counters.counts[Stage.ACKED] = 3
    assert registry.get_sample_value("ackkit_acked_total", {"listener": "l", "queue": "q"}) == 5


def test_tracing_is_a_no_op_without_a_tracer_provider() -> None:
    pytest.importorskip("opentelemetry")
    from ackkit.tracing import OpenTelemetryTracing

    app = App()

    @app.listener("q")
    def handle(body: bytes) -> None: ...

    OpenTelemetryTracing(app)  # the global provider is the API's default proxy here
    assert started(app)[2] is None


def test_tracing_span_continues_the_producer_trace_and_is_carried_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    sdk_trace = pytest.importorskip("opentelemetry.sdk.trace")
    from opentelemetry import trace
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from ackkit.tracing import OpenTelemetryTracing

    exporter = InMemorySpanExporter()
    provider = sdk_trace.TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    app = App()

    @app.listener("orders", name="o")
    def handle(body: bytes) -> None: ...

    OpenTelemetryTracing(app, tracer_provider=provider)
    _, c, probe = started(app)
    assert probe is not None
    parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    d = delivery(c, 1, headers={"traceparent": parent.encode()}, message_id="m-1")
    done = probe((d,))
    inner = trace.get_current_span()
    done(ValueError("boom"))
    (span,) = exporter.get_finished_spans()
    assert span.name == "process orders"
    assert span.kind is trace.SpanKind.CONSUMER
    assert format(span.context.trace_id, "032x") == "0af7651916cd43dd8448eb211c80319c"
    assert span.parent is not None and format(span.parent.span_id, "016x") == "b7ad6b7169203331"
    assert inner.get_span_context().span_id == span.context.span_id  # current in the handler
    assert span.attributes is not None and span.attributes["messaging.message.id"] == "m-1"
    assert span.status.status_code is trace.StatusCode.ERROR
    assert d._tracked.carry is not None
    carried = d._tracked.carry["traceparent"]
    assert carried.split("-")[1:3] == [
        "0af7651916cd43dd8448eb211c80319c",
        format(span.context.span_id, "016x"),
    ]
    assert trace.get_current_span() is trace.INVALID_SPAN  # detached after the handler


def test_the_first_failure_of_each_kind_is_logged_with_its_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Later ones of the same listener and error type are one line, until the traceback
    is due again; a new error type or listener gets its own traceback at once."""
    now = [0.0]
    flog = FailureLog(logging.getLogger("ackkit.test"), clock=lambda: now[0], burst=1000)

    def fail(listener: str, exc: BaseException) -> str:
        try:
            raise exc
        except BaseException as e:  # a real traceback
            caplog.clear()
            flog.failed(listener, "d", e)
        (r,) = caplog.records
        return r.getMessage()

    with caplog.at_level(logging.WARNING, logger="ackkit.test"):
        first = fail("l", KeyError("amqp://u:s3cret@h/v"))
        assert "Traceback (most recent call last)" in first and "in fail" in first
        assert "s3cret" not in first  # masked, traceback included
        assert "Traceback" not in fail("l", KeyError("again"))
        assert "Traceback" in fail("l", ValueError("other type"))
        assert "Traceback" in fail("other-listener", KeyError("k"))
        now[0] = 59.0
        assert "Traceback" not in fail("l", KeyError("k"))
        now[0] = 61.0
        assert "Traceback" in fail("l", KeyError("k"))


@given(st.lists(st.sampled_from(["A", "B", "C"]), max_size=50), st.floats(0.1, 100))
def test_a_traceback_per_kind_at_most_once_a_minute(kinds: list[str], step: float) -> None:
    now = [0.0]
    flog = FailureLog(logging.getLogger("ackkit.test.h"), clock=lambda: now[0])
    last: dict[str, float] = {}
    for k in kinds:
        due = flog._traceback_due("l", type(k, (Exception,), {})())
        expected = k not in last or now[0] - last[k] >= 60.0
        assert due == expected
        if due:
            last[k] = now[0]
        now[0] += step


def test_a_logged_traceback_is_bounded_and_writable(caplog: pytest.LogCaptureFixture) -> None:
    flog = FailureLog(logging.getLogger("ackkit.test.tb"))
    try:
        raise ValueError("x" * 300_000 + "\ud800")
    except ValueError as e:
        with caplog.at_level(logging.WARNING, logger="ackkit.test.tb"):
            flog.failed("l", "d", e)
    (r,) = caplog.records
    msg = r.getMessage()
    assert (len(msg) < 10_000 and "Traceback" not in msg[:200]) or msg.count("...") >= 1
    msg.encode("utf-8")  # no lone surrogate left: any handler can write it
    assert "\\ud800" in msg
