"""Delivery: one message as a handler sees it, and how it is settled; `Originals`: what
the core's delivery tags are to a runtime.

`DeliveryBase` holds what the message is (read-only); `Delivery` adds the blocking
ack / nack / reject / publish, and `ackkit._async.delivery.AsyncDelivery` the same as
coroutines. They are siblings, so a type checker sees `d.ack()` on an AsyncDelivery as
a coroutine that must be awaited."""

from __future__ import annotations

import json
from collections.abc import Mapping
from contextvars import ContextVar
from typing import Any, Protocol, TypeVar, cast

from pydantic import BaseModel, ValidationError

from .._core import wire
from .._core.errors import BadPayload
from .._core.listener import Tracked
from .publish import Outgoing, publishes, reply

M = TypeVar("M", bound=BaseModel)
T = TypeVar("T")


class Settler(Protocol):
    """What a runtime offers a Delivery to carry out a handler's settle."""

    def _settle(self, delivery: Delivery, kind: str, requeue: bool, multiple: bool) -> None: ...


class MessagePublisher(Protocol):
    """What a runtime offers a Delivery to publish (a settler may offer it too)."""

    def publish_message(self, msg: Outgoing) -> None: ...


class BodyCheck(Protocol):
    """What a Delivery asks of its listener's decoder (handler.Decoder) before it parses
    its body."""

    def check(self, d: DeliveryBase) -> None:
        """Raise BadPayload when `d`'s body is not one to parse (size, content type)."""
        ...


# What `db` reads as in a handler whose inbox has no database: the in-memory inbox sets
# it for its transactions (ackkit.inbox._memory.NoDatabase); None elsewhere.
NO_DATABASE: ContextVar[Any] = ContextVar("ackkit_no_database", default=None)


class DeliveryBase:
    """What a delivered message is, on either runtime (read-only).

    `body` is bytes; `properties` are the AMQP basic properties (attribute
    names as in pika: content_type, headers, message_id, ...). `attempt` is
    1-based and survives restarts and broker retries (ackkit's own header,
    a quorum queue's x-delivery-count, or the redelivered flag).
    """

    __slots__ = (
        "_db",
        "_decoder",
        "_headers",
        "_settler",
        "_tracked",
        "body",
        "exchange",
        "properties",
        "queue",
        "redelivered",
        "routing_key",
    )

    def __init__(
        self,
        body: bytes,
        properties: Any,
        tracked: Tracked,
        settler: Any,
        *,
        exchange: str = "",
        routing_key: str = "",
        redelivered: bool = False,
        queue: str = "",
        decoder: BodyCheck | None = None,
    ) -> None:
        self.body = body
        self.properties = properties
        self._tracked = tracked
        self._settler = settler
        self.exchange = exchange
        self.routing_key = routing_key
        self.redelivered = redelivered
        self.queue = queue
        self._db: Any = None
        self._decoder = decoder
        self._headers: Mapping[str, Any] | None = None

    @property
    def db(self) -> Any:
        """An inbox listener's transaction connection while its handler runs (a psycopg
        Connection, or AsyncConnection on AsyncApp); None otherwise.

        On the in-memory inbox (``Inbox("memory://...")``), which has no database, it is
        a stand-in that is false (``if delivery.db:`` skips) and raises an error naming
        the fix on any other use: test such a handler on PostgreSQL
        (``Inbox(postgres_dsn)``, the test kit's fixture)."""
        db = self._db
        return NO_DATABASE.get() if db is None else db

    @db.setter
    def db(self, value: Any) -> None:
        self._db = value

    # -- what the message is ------------------------------------------------

    @property
    def delivery_tag(self) -> int:
        """The broker's number for this delivery on its channel."""
        return self._tracked.tag

    @property
    def attempt(self) -> int:
        """Which attempt at this message this is: 1 the first time, counted across
        redeliveries, restarts and broker retries."""
        return self._tracked.attempt

    @property
    def headers(self) -> Mapping[str, Any]:
        """The message's headers ({} when it has none), float and double values as
        floats on every runtime (pika alone reads 2.5 as 2)."""
        if self._headers is None:
            h = getattr(self.properties, "headers", None)
            raw = getattr(self.properties, "wire_headers", None)
            if not h:
                self._headers = {} if h is None else h
            else:
                self._headers = wire.exact_floats(h, raw) if raw else h
        return self._headers

    @property
    def message_id(self) -> str | None:
        """The message_id property, None when the publisher set none."""
        return getattr(self.properties, "message_id", None)

    @property
    def content_type(self) -> str | None:
        """The content_type property, None when the publisher set none."""
        return getattr(self.properties, "content_type", None)

    @property
    def settled(self) -> bool:
        """True once this delivery was acked, nacked or rejected (by the handler or by
        ackkit)."""
        return self._tracked.settled

    def text(self) -> str:
        """The body decoded as UTF-8; BadPayload when it is not."""
        try:
            return self.body.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise BadPayload(f"body is not valid UTF-8: {exc}") from None

    def json(self) -> Any:
        """The body decoded as JSON; BadPayload when it cannot be."""
        if self._decoder is not None:
            self._decoder.check(self)
        return decode_json(self.body)

    def model(self, model: type[M]) -> M:
        """The body validated into a pydantic model; BadPayload when it does not match."""
        if self._decoder is not None:
            self._decoder.check(self)
        try:
            return model.model_validate_json(self.body)
        except ValidationError as exc:
            raise BadPayload(_validation_reason(model, exc)) from None
        except RecursionError:
            raise BadPayload(TOO_DEEP) from None

    def __repr__(self) -> str:
        return (
            f"<{type(self).__name__} queue={self.queue!r} tag={self.delivery_tag} "
            f"attempt={self.attempt} message_id={self.message_id!r} bytes={len(self.body)}>"
        )


class Delivery(DeliveryBase):
    """A message delivered to a listener (or fetched with basic.get), settled with
    blocking calls: `delivery.ack()`. (On AsyncApp, `async def` handlers get an
    `AsyncDelivery`, whose settle methods are coroutines.)
    """

    __slots__ = ()

    # -- settling --------------------------------------------------------------

    def ack(self, multiple: bool = False) -> None:
        """Acknowledge (processed). multiple=True also acks every earlier delivery."""
        self._sync_settler._settle(self, "ack", False, multiple)

    def nack(self, requeue: bool = True, multiple: bool = False) -> None:
        """Negative ack. requeue=False dead-letters (to the listener's DLQ if it has one)."""
        self._sync_settler._settle(self, "nack", requeue, multiple)

    def reject(self, requeue: bool = False) -> None:
        """Reject one delivery. requeue=False dead-letters (to the DLQ if there is one)."""
        self._sync_settler._settle(self, "reject", requeue, False)

    # -- publishing -----------------------------------------------------------

    @publishes
    def publish(self, msg: Outgoing) -> None:
        """Publish a message on the connection this delivery came from, and wait for the
        broker's confirm."""
        self._publisher().publish_message(msg)

    def reply(self, body: object, **options: Any) -> None:
        """Publish `body` to this delivery's `reply_to` queue with its correlation_id (its
        message_id when it has none), confirmed; ValueError when it has no reply_to."""
        self._publisher().publish_message(reply(self, body, **options))

    def _publisher(self) -> MessagePublisher:
        if not hasattr(self._settler, "publish_message"):
            raise TypeError(f"{self!r} cannot publish: its source offers no publisher")
        return cast(MessagePublisher, self._settler)

    @property
    def _sync_settler(self) -> Settler:
        return cast(Settler, self._settler)


TOO_DEEP = "body is nested too deeply to decode"


def decode_json(body: bytes) -> Any:
    """json.loads for a body; every way it can fail is a BadPayload (a body nested
    deeper than the interpreter's recursion limit raises RecursionError, which would
    otherwise be retried as a handler failure)."""
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadPayload(f"body is not valid JSON: {exc}") from None
    except RecursionError:
        raise BadPayload(TOO_DEEP) from None


def _adapter_reason(adapter: Any, exc: ValidationError) -> str:
    errs = exc.errors(include_url=False, include_input=False)
    parts = [f"{'.'.join(str(p) for p in e['loc']) or '<root>'}: {e['msg']}" for e in errs[:5]]
    more = f" (+{len(errs) - 5} more)" if len(errs) > 5 else ""
    return f"does not match {getattr(adapter, '_type', adapter)!r}: " + "; ".join(parts) + more


def _validation_reason(model: type[BaseModel], exc: ValidationError) -> str:
    errs = exc.errors(include_url=False, include_input=False)
    parts = [f"{'.'.join(str(p) for p in e['loc']) or '<root>'}: {e['msg']}" for e in errs[:5]]
    more = f" (+{len(errs) - 5} more)" if len(errs) > 5 else ""
    return f"does not match {model.__name__}: " + "; ".join(parts) + more
