"""Flow control for a listener: `listener(flow=Flow(...))` with a circuit breaker, a
rate limit or a serial key, and the states `App.flow_state()` reports."""

from ._app.listener_values import Flow
from ._core.flow import CircuitBreaker, FlowState, KeySource, RateLimit, SerialKey

__all__ = ["CircuitBreaker", "Flow", "FlowState", "KeySource", "RateLimit", "SerialKey"]
