"""Exchanges and bindings: what `Queue(bind=...)` can name besides
`(exchange, routing_key)` pairs."""

from ._core.exchanges import Bind, Exchange, ExchangeType

__all__ = ["Bind", "Exchange", "ExchangeType"]
