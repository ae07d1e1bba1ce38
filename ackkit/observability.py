"""What ackkit tells you about deliveries: the lifecycle `Event`s an `on_event` observer
receives, their `Stage`s, and `mask_url` for logging a broker URL without its password.
(Prometheus metrics: `ackkit.metrics`; OpenTelemetry: `ackkit.tracing`.)"""

from ._connection.url import mask_url
from ._core.events import Event, Stage

__all__ = ["Event", "Stage", "mask_url"]
