"""OpenTelemetry tracing for ackkit listeners (opentelemetry-api; a no-op without it).

    from ackkit.tracing import OpenTelemetryTracing

    OpenTelemetryTracing(app)     # before app.start(), after setting up a tracer provider

Every handler invocation runs in a CONSUMER span ("process <queue>") whose
parent is the trace context the producer put in the message's headers
(`traceparent`, W3C). The span is the current span while the handler runs, so
the handler's own spans are its children. Every copy ackkit republishes for
the delivery (to a retry delay queue, to the dead-letter queue) carries that
span's context, so publish -> consume -> retry -> ... -> DLQ (-> replay) is one
trace. A batch handler's invocation is one span linked to each message's
producer span.

Nothing happens, at no cost per message, when opentelemetry-api is not
installed or no tracer provider is set (the API's default), as seen when the
app starts. Uses the global propagator (`opentelemetry.propagate`). Known gap:
a plain `def` handler of an AsyncApp runs on a thread pool that does not carry
the context, so spans it opens itself start their own trace.
"""

from __future__ import annotations

import contextlib
import logging
from typing import TYPE_CHECKING, Any

from ._app.spec import AppBase, ListenerSpec

if TYPE_CHECKING:
    from ._app.invocation import HandlerProbe
    from ._core.listener import ListenerCore

__all__ = ["OpenTelemetryTracing"]

log = logging.getLogger("ackkit")


class OpenTelemetryTracing:
    """Trace the handler invocations of an App or AsyncApp.

    `tracer_provider`: the provider to use; default the global one at the time
    the app starts.
    """

    def __init__(self, app: AppBase, *, tracer_provider: Any = None) -> None:
        self.app = app
        self.tracer_provider = tracer_provider
        app._add_instrument(self._instrument)

    def _instrument(self, spec: ListenerSpec, core: ListenerCore) -> HandlerProbe | None:
        try:
            from ._telemetry.otel import make_probe, tracer_for
        except ImportError:
            log.info("ackkit tracing is off: opentelemetry-api is not installed")
            return None
        tracer = tracer_for(self.tracer_provider)
        if tracer is None:
            log.debug("ackkit tracing is off for %s: no tracer provider is set", spec.name)
            return None
        return make_probe(spec, tracer)

    def close(self) -> None:
        """Stop tracing the listeners of runtimes started from now on."""
        with contextlib.suppress(ValueError):
            self.app._instruments.remove(self._instrument)
