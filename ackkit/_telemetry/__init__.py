"""What ackkit tells the outside about itself while it runs (the "ackkit" logger's lines,
observers, OpenTelemetry spans).

Here: ackkit's log lines about deliveries and lifecycle (`logs`), the thread the
application's observers run on (`observers`), and the OpenTelemetry side of
`ackkit.tracing` (`otel`, imported only when opentelemetry-api is there).

Not here: the public faces (`ackkit.observability`, `ackkit.metrics`,
`ackkit.tracing`), the events themselves (`ackkit._core.events`).
"""
