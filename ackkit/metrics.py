"""Prometheus metrics for ackkit listeners (the `metrics` extra).

    from ackkit.metrics import PrometheusMetrics

    metrics = PrometheusMetrics(app)          # before app.start(); default registry
    metrics.serve(9100)                       # or: ackkit run module:app --metrics-port 9100

Per listener (labels `listener`, `queue`):

- counters of the settlement lifecycle: `ackkit_delivered_total`, `ackkit_acked_total`,
  `ackkit_nacked_total`, `ackkit_requeued_total`, `ackkit_rejected_total`,
  `ackkit_retried_total`, `ackkit_dead_lettered_total`, `ackkit_stale_dropped_total`,
  `ackkit_unsettled_total`, `ackkit_returned_total`, `ackkit_copy_refused_total`, and of
  flow control:
  `ackkit_paused_total`, `ackkit_tripped_total`, `ackkit_throttled_total`;
- `ackkit_flow_state{state="consuming|paused|tripped|probing|standby|refused"}`: 1 for
  the current state (standby: another consumer holds the queue exclusively; refused: the
  broker refuses the listener's copies);
- `ackkit_ack_batch_size`: histogram of deliveries settled by one basic.ack frame;
- `ackkit_in_flight` (delivered, not settled yet), `ackkit_pending_acks` (settled, the
  ack frame not sent yet), `ackkit_republishing` (retry / dead-letter copies waiting
  for their publisher confirm): gauges;
- `ackkit_handler_duration_seconds{outcome="ok|error|cancelled"}`: histogram of
  handler invocations (a batch handler's invocation is one observation).

Cost: the counters, the ack batch sizes and the gauges are what the listener
cores keep anyway; they are read when Prometheus scrapes, never per message.
Only the handler duration is measured per invocation: two clock reads and one
histogram observation.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import weakref
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

try:
    from prometheus_client import REGISTRY, CollectorRegistry, Histogram, start_http_server
    from prometheus_client.core import (
        CounterMetricFamily,
        GaugeMetricFamily,
        HistogramMetricFamily,
        Metric,
    )
    from prometheus_client.registry import Collector
except ImportError as exc:  # pragma: no cover - exercised by the packaging test
    raise ImportError(
        "ackkit.metrics needs prometheus-client: pip install 'ackkit[metrics]'", name=exc.name
    ) from exc

from ._app.spec import AppBase, ListenerSpec
from ._core.events import FRAME_BUCKETS, Stage
from ._core.flow import FlowState
from ._core.listener import ListenerCore

if TYPE_CHECKING:
    from ._app.invocation import HandlerDone, HandlerProbe
    from ._messages.delivery import DeliveryBase

__all__ = ["DURATION_BUCKETS", "MetricsServer", "PrometheusMetrics"]

log = logging.getLogger("ackkit")

LABELS = ("listener", "queue")

DURATION_BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
)
"""Default buckets of `ackkit_handler_duration_seconds` (sub-millisecond handlers too)."""

# stage -> (metric name without _total, help)
COUNTERS: tuple[tuple[Stage, str, str], ...] = (
    (Stage.RECEIVED, "ackkit_delivered", "Deliveries received from the broker."),
    (Stage.ACKED, "ackkit_acked", "Deliveries settled as processed (acked)."),
    (Stage.NACKED, "ackkit_nacked", "Deliveries negatively acknowledged by the handler."),
    (Stage.REQUEUED, "ackkit_requeued", "Deliveries put back on their queue."),
    (
        Stage.REJECTED,
        "ackkit_rejected",
        "Deliveries rejected without requeue (to the queue's DLX, or dropped).",
    ),
    (Stage.RETRYING, "ackkit_retried", "Failed deliveries given another attempt."),
    (
        Stage.DEAD_LETTERED,
        "ackkit_dead_lettered",
        "Dead letters the broker confirmed (in the dead-letter queue).",
    ),
    (
        Stage.DROPPED_STALE,
        "ackkit_stale_dropped",
        "Settles dropped because their channel had closed (the broker requeued them).",
    ),
    (
        Stage.UNSETTLED,
        "ackkit_unsettled",
        "Handlers that returned without settling (on_unsettled applied).",
    ),
    (
        Stage.RETURNED,
        "ackkit_returned",
        "Prefetched deliveries returned unstarted (shutdown, pause, a tripped breaker).",
    ),
    (
        Stage.COPY_REFUSED,
        "ackkit_copy_refused",
        "Retry, dead-letter or restamp copies the broker refused (the original kept).",
    ),
    (
        Stage.PAUSED,
        "ackkit_paused",
        "Times the listener was paused (by hand, or while the broker refuses its copies).",
    ),
    (Stage.TRIPPED, "ackkit_tripped", "Times the listener's circuit breaker tripped."),
    (
        Stage.THROTTLED,
        "ackkit_throttled",
        "Handler starts (or batches) that waited for the listener's rate limit.",
    ),
    (
        Stage.CONSUMER_CANCELLED,
        "ackkit_consumer_cancelled",
        "Times the broker cancelled the consumer (e.g. a consumer timeout on RabbitMQ 4.3+).",
    ),
    (
        Stage.DUPLICATE,
        "ackkit_duplicates",
        "Inbox deliveries whose key was recorded already: acked without running the handler.",
    ),
)


class _ListenerCollector(Collector):
    """Reads the listener cores' counters when the registry is scraped."""

    def __init__(self, app: AppBase) -> None:
        self.app = app
        # A counter must not go down: TRANSACTED moves a rolled-back ack from acked to
        # requeued, so each series reports the highest value it has shown.
        self._high: weakref.WeakKeyDictionary[ListenerCore, dict[str, float]] = (
            weakref.WeakKeyDictionary()
        )

    def describe(self) -> Iterable[Metric]:
        return list(self._families())

    def collect(self) -> Iterable[Metric]:
        fams = self._families()
        counters = fams[: len(COUNTERS)]
        frames, in_flight, pending, republishing, flow_state = fams[len(COUNTERS) :]
        for spec, core in list(self.app._cores.values()):
            labels = [spec.name, spec.queue]
            c = core.counters
            high = self._high.setdefault(core, {})
            for fam, (stage, name, _) in zip(counters, COUNTERS, strict=True):
                value = max(c.counts[stage], high.get(name, 0))
                high[name] = value
                fam.add_metric(labels, value)
            sizes = list(c.frame_sizes)
            buckets: list[tuple[str, float]] = []
            total = 0
            for bound, n in zip(FRAME_BUCKETS, sizes, strict=False):
                total += n
                buckets.append((str(float(bound)), total))  # "5.0", as prometheus_client writes it
            buckets.append(("+Inf", total + sizes[-1]))
            frames.add_metric(labels, buckets, c.acked_by_frames)
            now_held = core.gauges()
            in_flight.add_metric(labels, now_held.outstanding)
            pending.add_metric(labels, now_held.pending_acks)
            republishing.add_metric(labels, now_held.republishing)
            now = core.gating.flow.state
            for st in FlowState:
                flow_state.add_metric([*labels, st.value], 1.0 if st is now else 0.0)
        return fams

    @staticmethod
    def _families() -> list[Any]:
        fams: list[Any] = [
            CounterMetricFamily(name, doc, labels=LABELS) for _, name, doc in COUNTERS
        ]
        fams.append(
            HistogramMetricFamily(
                "ackkit_ack_batch_size",
                "Deliveries settled by one basic.ack frame (multiple-ack batching).",
                labels=LABELS,
            )
        )
        fams.append(
            GaugeMetricFamily(
                "ackkit_in_flight", "Deliveries received and not settled yet.", labels=LABELS
            )
        )
        fams.append(
            GaugeMetricFamily(
                "ackkit_pending_acks",
                "Deliveries settled as processed whose ack frame is not sent yet.",
                labels=LABELS,
            )
        )
        fams.append(
            GaugeMetricFamily(
                "ackkit_republishing",
                "Retry and dead-letter copies waiting for their publisher confirm.",
                labels=LABELS,
            )
        )
        fams.append(
            GaugeMetricFamily(
                "ackkit_flow_state",
                "1 for the listener's flow state (consuming, paused, tripped, probing, standby).",
                labels=[*LABELS, "state"],
            )
        )
        return fams


class MetricsServer:
    """The HTTP server of `PrometheusMetrics.serve()`."""

    def __init__(self, server: Any, thread: threading.Thread) -> None:
        self._server = server
        self._thread = thread

    @property
    def port(self) -> int:
        port: int = self._server.server_port
        return port

    def close(self) -> None:
        """Stop serving and close the listening socket."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5.0)


class PrometheusMetrics:
    """Prometheus metrics of one App or AsyncApp.

    Create it before `app.start()`: the handler duration is measured from the
    next start on (the counters are read from whatever runtime ran last, also
    after it stopped). `registry` defaults to prometheus_client's REGISTRY.
    """

    def __init__(
        self,
        app: AppBase,
        *,
        registry: CollectorRegistry = REGISTRY,
        duration_buckets: Sequence[float] = DURATION_BUCKETS,
    ) -> None:
        self.app = app
        self.registry = registry
        self._collector = _ListenerCollector(app)
        self.handler_duration = Histogram(
            "ackkit_handler_duration_seconds",
            "Handler invocations: how long the handler ran, by outcome (ok, error, cancelled).",
            [*LABELS, "outcome"],
            registry=None,
            buckets=tuple(duration_buckets),
        )
        registry.register(self._collector)
        try:
            registry.register(self.handler_duration)
        except ValueError:
            registry.unregister(self._collector)
            raise
        if getattr(app, "is_running", False):
            log.warning(
                "PrometheusMetrics: the app is running already; handler durations are "
                "measured from its next start"
            )
        app._add_instrument(self._instrument)

    def _instrument(self, spec: ListenerSpec, core: ListenerCore) -> HandlerProbe:
        ok, error, cancelled = (
            self.handler_duration.labels(spec.name, spec.queue, outcome)
            for outcome in ("ok", "error", "cancelled")
        )
        clock = time.perf_counter

        def start(ds: Sequence[DeliveryBase]) -> HandlerDone:
            t0 = clock()

            def done(exc: BaseException | None) -> None:
                took = clock() - t0
                if exc is None:
                    ok.observe(took)
                elif isinstance(exc, Exception):
                    error.observe(took)
                else:
                    cancelled.observe(took)

            return done

        return start

    def serve(self, port: int, addr: str = "127.0.0.1") -> MetricsServer:
        """Serve the registry's /metrics over HTTP from a background thread (port 0: any
        free port, see `.port`), on loopback unless `addr` says otherwise (e.g. "0.0.0.0"
        for a scraper on another host)."""
        server, thread = start_http_server(port, addr, registry=self.registry)
        return MetricsServer(server, thread)

    def close(self) -> None:
        """Remove the metrics from the registry (the app keeps running uninstrumented
        from its next start)."""
        for c in (self._collector, self.handler_duration):
            with contextlib.suppress(KeyError):
                self.registry.unregister(c)
        with contextlib.suppress(ValueError):
            self.app._instruments.remove(self._instrument)

    def samples(self) -> Iterator[tuple[str, dict[str, str], float]]:
        """(name, labels, value) of every sample ackkit exports right now (for tests and
        quick looks; Prometheus itself scrapes the registry)."""
        for metric in (*self._collector.collect(), *self.handler_duration.collect()):
            for s in metric.samples:
                yield s.name, dict(s.labels), s.value
