"""The OpenTelemetry side of ackkit.tracing (imported only when opentelemetry-api is there)."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.propagators.textmap import Getter
from opentelemetry.trace import Link, SpanKind, Status, StatusCode
from opentelemetry.util.types import AttributeValue

from .. import __version__
from .._app.spec import ListenerSpec

if TYPE_CHECKING:
    from .._app.invocation import HandlerDone, HandlerProbe
    from .._messages.delivery import DeliveryBase

log = logging.getLogger("ackkit")


class _HeaderGetter(Getter[Mapping[str, Any]]):
    """AMQP headers as a propagation carrier (values may arrive as bytes)."""

    def get(self, carrier: Mapping[str, Any], key: str) -> list[str] | None:
        value = carrier.get(key)
        if value is None:
            return None
        if isinstance(value, bytes | bytearray):
            value = bytes(value).decode("utf-8", "replace")
        return [str(value)]

    def keys(self, carrier: Mapping[str, Any]) -> list[str]:
        return list(carrier)


_GETTER = _HeaderGetter()


def _noop(exc: BaseException | None) -> None:
    pass


def tracer_for(provider: Any) -> trace.Tracer | None:
    """A tracer of `provider` (default: the global one), or None when nothing records spans:
    no tracer provider set, or a no-op one."""
    if provider is None:
        provider = trace.get_tracer_provider()
    if isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider):
        return None
    tracer: trace.Tracer = provider.get_tracer("ackkit", __version__)
    return tracer


def make_probe(spec: ListenerSpec, tracer: trace.Tracer) -> HandlerProbe:
    """A CONSUMER span around every handler invocation of `spec`'s listener."""
    name = f"process {spec.queue}"
    base: dict[str, AttributeValue] = {
        "messaging.system": "rabbitmq",
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
        "ackkit.listener": spec.name,
        "ackkit.queue": spec.queue,
    }

    def start(ds: Sequence[DeliveryBase]) -> HandlerDone:
        try:
            if len(ds) == 1:
                d = ds[0]
                parent = propagate.extract(d.headers, getter=_GETTER)
                links: list[Link] = []
                attrs: dict[str, AttributeValue] = {
                    **base,
                    "messaging.destination.name": d.exchange or d.queue,
                    "messaging.rabbitmq.destination.routing_key": d.routing_key,
                    "messaging.rabbitmq.message.delivery_tag": d.delivery_tag,
                    "ackkit.attempt": d.attempt,
                }
                if d.message_id:
                    attrs["messaging.message.id"] = d.message_id
            else:
                # A batch: its own trace, linked to every message's producer span.
                parent = otel_context.Context()
                links = []
                for d in ds:
                    sc = trace.get_current_span(
                        propagate.extract(d.headers, getter=_GETTER)
                    ).get_span_context()
                    if sc.is_valid:
                        links.append(Link(sc))
                attrs = {**base, "messaging.batch.message_count": len(ds)}
            span = tracer.start_span(
                name, context=parent, kind=SpanKind.CONSUMER, attributes=attrs, links=links
            )
            ctx = trace.set_span_in_context(span, parent)
            carry: dict[str, Any] = {}
            propagate.inject(carry, context=ctx)
            for d in ds:
                # Every copy republished for it (retry delay queue, DLQ) continues this trace.
                d._tracked.carry = carry
            token = otel_context.attach(ctx)
        except Exception:
            log.debug("ackkit tracing: starting a span failed", exc_info=True)
            return _noop

        def done(exc: BaseException | None) -> None:
            try:
                otel_context.detach(token)
                if isinstance(exc, Exception):
                    span.record_exception(exc)
                    span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
                elif exc is not None:
                    span.set_attribute("ackkit.cancelled", True)
                span.end()
            except Exception:
                log.debug("ackkit tracing: ending a span failed", exc_info=True)

        return done

    return start
