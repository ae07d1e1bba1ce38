"""What a client stand-in's channel asks of the in-memory broker: each AMQP method as
the call on the model it comes down to, written once for every client.

pika's channels (`_mem_pika`, `_mem_blocking`) and aiormq's (`_mem_aio`) keep their
client's signatures, replies and threading, and say in `_run` how a broker error
(`ChannelError`) reaches their caller: as the client's exception, or (a pika
SelectConnection's channel) through the closed channel's callbacks, when `_run` and the
method here return None.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ._mem_model import Model
from ._mem_state import Channel, Message


class ModelChannel:
    """The broker side of a client channel: `state` is its channel in `_model`."""

    _model: Model
    state: Channel

    def _run(self, op: Callable[[], Any]) -> Any:
        """Run `op` (a call on the model) as this client runs a channel method."""
        raise NotImplementedError

    def _qos(self, prefetch_count: int, global_qos: bool) -> Any:
        return self._run(lambda: self._model.qos(self.state, prefetch_count, global_qos))

    def _consume(self, queue: str, no_ack: bool, tag: str, exclusive: bool) -> Any:
        return self._run(lambda: self._model.consume(self.state, queue, no_ack, tag, exclusive))

    def _cancel(self, consumer_tag: str) -> None:
        self._run(lambda: self._model.cancel(self.state, consumer_tag))

    def _settle(self, kind: str, delivery_tag: int, multiple: bool, requeue: bool) -> None:
        """basic.ack, basic.nack or basic.reject (`kind`)."""
        self._run(lambda: self._model.settle(self.state, kind, delivery_tag, multiple, requeue))

    def _tx(self, step: Callable[[Channel], None]) -> None:
        """tx.select, tx.commit or tx.rollback: the model's `step`."""
        self._run(lambda: step(self.state))

    def _declare_queue(
        self,
        queue: str,
        passive: bool,
        durable: bool,
        exclusive: bool,
        arguments: dict[str, Any] | None,
    ) -> tuple[str, int, int] | None:
        """queue.declare-ok's fields: the queue's name, message count and consumer count."""
        q = self._run(
            lambda: self._model.queue_declare(
                queue,
                passive=passive,
                durable=durable,
                exclusive=exclusive,
                arguments=arguments,
            )
        )
        return None if q is None else (q.name, len(q.ready), len(q.consumers))

    def _declare_exchange(
        self,
        exchange: str,
        exchange_type: Any,
        passive: bool,
        durable: bool,
        arguments: dict[str, Any] | None,
    ) -> bool | None:
        """True once declared; `exchange_type` is a name or an enum of names (aio-pika's)."""
        kind = getattr(exchange_type, "value", exchange_type)

        def op() -> bool:
            self._model.exchange_declare(
                exchange, kind, passive=passive, durable=durable, arguments=arguments
            )
            return True

        result: bool | None = self._run(op)
        return result

    def _bind(
        self, queue: str, exchange: str, routing_key: str, arguments: dict[str, Any] | None
    ) -> bool | None:
        """True once bound."""

        def op() -> bool:
            self._model.queue_bind(queue, exchange, routing_key, arguments)
            return True

        result: bool | None = self._run(op)
        return result

    def _publish(self, msg: Message, mandatory: bool) -> tuple[bool, bool] | None:
        """(returned, refused): no queue took a mandatory `msg`; a queue refused it."""
        result: tuple[bool, bool] | None = self._run(
            lambda: self._model.publish(msg, mandatory=mandatory)
        )
        return result

    def _get(self, queue: str, no_ack: bool) -> tuple[int, Message, int] | None:
        """basic.get: (delivery tag, message, messages left), or None when empty."""
        result: tuple[int, Message, int] | None = self._run(
            lambda: self._model.get(self.state, queue, no_ack)
        )
        return result
