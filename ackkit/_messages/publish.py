"""Publishing: one front, one set of defaults, for every way ackkit publishes.

`App.publish`, `AsyncApp.publish`, `Delivery.publish` / `reply` (and the
async delivery's), `PullConnection.publish`, `AsyncPullConnection.publish` and
the test kit's `broker.publish` all build their message with `outgoing(...)`
(the same call gives the same message on the wire, whichever front takes it);
`publishes` / `apublishes` give a class that front, in front of a carrier
that only puts the built `Outgoing` on the wire and waits for the broker's
confirm. A bad option fails here, at the caller's line. `failure(...)` is the
one rule of what a carrier's outcome means for its caller. No client library
is imported.

The options and their defaults are written down once, in `outgoing`'s docstring;
each front's docstring is its own first lines followed by that one.
"""

from __future__ import annotations

import functools
import inspect
import json
import uuid
from collections.abc import Awaitable, Callable, Collection, Coroutine, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any, Concatenate, ParamSpec, Protocol, TypeVar

from pydantic import BaseModel

from .._core import checks as C
from .._core import wire
from .._core.errors import MessageUnroutable, PublishError, PublishNacked, PublishNotConfirmed

PUBLISH_TIMEOUT = 30.0
"""Seconds a publish waits for the broker's confirm by default."""

MAX_BODY = 512 * 1024 * 1024
"""The largest body any RabbitMQ takes (its max_message_size cannot be set higher; the
default is 128 MiB on 3.x, 16 MiB on 4.x, and a larger message closes the channel:
PublishNotConfirmed with the broker's words). A larger one fails at the call."""

AUTO = "auto"
"""content_type=AUTO: application/json for a model or a JSON value, none for bytes or str."""

JSON = "application/json"


class _NewId(Enum):
    """The default of `message_id`: a new id for each message (None sends none)."""

    NEW = "new"

    def __repr__(self) -> str:  # as help() and the docs show the default
        return "<a new uuid4().hex>"


NEW_ID = _NewId.NEW
"""message_id=NEW_ID (the default): a new uuid4().hex for each message."""
NOT_RUNNING = (
    "publish() needs the app running (app.start(), app.run() or `with app.running()`); "
    "a script that only publishes uses `with ackkit.connect(url) as conn: conn.publish(...)`"
)
_SET_BY_ARGUMENT = ("headers", "message_id", "content_type", "delivery_mode", "correlation_id")
_EXTRA = frozenset(wire.PROPERTY_NAMES) - {"cluster_id", *_SET_BY_ARGUMENT}


@dataclass(frozen=True, slots=True)
class Outgoing:
    """One message to publish: where to, its body, its AMQP properties by name."""

    exchange: str
    routing_key: str
    body: bytes
    properties: Mapping[str, Any]
    mandatory: bool = True
    timeout: float = PUBLISH_TIMEOUT

    @property
    def where(self) -> str:
        """`exchange 'x' with routing key 'k'`, or `queue 'k'` for the default exchange."""
        if self.exchange:
            return f"exchange {self.exchange!r} with routing key {self.routing_key!r}"
        return f"queue {self.routing_key!r} (default exchange)"


def encode_body(body: object) -> tuple[bytes, str | None]:
    """(bytes, the content type they imply): a pydantic model or any other JSON value is
    JSON; bytes are sent as they are and str as UTF-8, both without a content type."""
    if isinstance(body, bytes | bytearray | memoryview):
        return bytes(body), None
    if isinstance(body, str):
        return body.encode("utf-8"), None
    if isinstance(body, BaseModel):
        return body.model_dump_json().encode("utf-8"), JSON
    try:
        return json.dumps(body, separators=(",", ":"), allow_nan=False).encode("utf-8"), JSON
    except (TypeError, ValueError) as exc:
        raise TypeError(
            f"body must be bytes, str, a pydantic model or a JSON value; {type(body).__name__} "
            f"is not: {exc}"
        ) from None


def outgoing(
    routing_key: str,
    body: object,
    *,
    exchange: str = "",
    headers: Mapping[str, Any] | None = None,
    message_id: str | _NewId | None = NEW_ID,
    correlation_id: str | None = None,
    content_type: str | None = AUTO,
    persistent: bool = True,
    mandatory: bool = True,
    timeout: float = PUBLISH_TIMEOUT,
    **properties: Any,
) -> Outgoing:
    """The message a publish sends; ValueError / TypeError for a bad option, at once.

    Options and defaults (the same on every publish front):

    ==================  ==========================================================
    property            when the caller does not set it
    ==================  ==========================================================
    ``message_id``      a new ``uuid4().hex`` (32 hex digits) for each message;
                        ``message_id=None`` sends the message without one
    ``content_type``    from the body: ``application/json`` for a pydantic model or
                        any other JSON value; none for ``bytes`` / ``str`` (sent as
                        they are: a str may already be JSON text)
    ``delivery_mode``   2, persistent (``persistent=False``: 1)
    ``headers``         none (a dict of AMQP field-table values, checked here)
    ``correlation_id``  none (``reply()``: the delivery's correlation_id, else its
                        message_id)
    body                at most 512 MiB (``MAX_BODY``); the broker's own
                        max_message_size (16 MiB on 4.x) is its to enforce
    mandatory           True: a message no queue takes raises ``MessageUnroutable``
    confirms            always: the call returns once the broker confirmed it;
                        ``PublishNacked`` when refused, ``PublishNotConfirmed``
                        when no answer came within ``timeout`` (30 s)
    ==================  ==========================================================

    Other AMQP properties (``reply_to``, ``expiration``, ``priority``,
    ``timestamp``, ``type``, ``user_id``, ``app_id``, ``content_encoding``) are
    keyword arguments, sent only when given.

    Errors: ``TypeError`` / ``ValueError`` for a bad option (nothing is sent),
    ``MessageUnroutable``, ``PublishNacked``, ``PublishNotConfirmed`` (all
    ``PublishError``).
    """
    C.text("exchange", exchange, empty=True)
    if len(exchange.encode()) > 255:
        raise ValueError(f"exchange name longer than 255 bytes: {exchange[:40]!r}...")
    C.text("routing_key", routing_key, empty=True)
    if len(routing_key.encode()) > 255:
        raise ValueError(f"routing_key longer than 255 bytes: {routing_key[:40]!r}...")
    C.flag("persistent", persistent)
    C.flag("mandatory", mandatory)
    C.number("timeout", timeout, 0, 86_400.0, above=True)
    unknown = sorted(set(properties) - _EXTRA)
    if unknown:
        raise TypeError(
            f"unknown publish option(s) {', '.join(unknown)}; AMQP properties are "
            f"{', '.join(sorted(_EXTRA | set(_SET_BY_ARGUMENT) - {'delivery_mode'}))}"
        )
    data, implied = encode_body(body)
    if len(data) > MAX_BODY:
        raise ValueError(
            f"body of {len(data)} bytes is larger than any RabbitMQ takes ({MAX_BODY} bytes)"
        )
    if message_id is NEW_ID:
        message_id = uuid.uuid4().hex
    for name, value in (
        ("message_id", message_id),
        ("correlation_id", correlation_id),
        ("content_type", content_type),
    ):
        if value is not None and not isinstance(value, str):
            raise TypeError(f"{name} must be a str or None, got {value!r}")
    props: dict[str, Any] = {
        **{k: v for k, v in properties.items() if v is not None},
        "headers": C.amqp_table("headers", headers) or None,
        "message_id": message_id,
        "correlation_id": correlation_id,
        "content_type": implied if content_type == AUTO else content_type,
        "delivery_mode": 2 if persistent else 1,
    }
    props = {k: v for k, v in props.items() if v is not None}
    try:
        wire.encode_properties(props)  # a value AMQP cannot carry fails here, not on the wire
    except Exception as exc:
        raise ValueError(f"publish properties cannot be sent: {exc}") from None
    return Outgoing(exchange, routing_key, data, props, mandatory, timeout)


P = ParamSpec("P")
T = TypeVar("T")


def _front(carrier: Callable[..., Any], front: Callable[..., Any]) -> None:
    """Give `front` the carrier's name and docstring and outgoing()'s signature (after
    `self`), for help(), IDEs and the docs."""
    functools.update_wrapper(front, carrier)
    del front.__wrapped__  # type: ignore[attr-defined]
    options = (outgoing.__doc__ or "").split("\n", 1)[1]
    front.__doc__ = inspect.cleandoc(carrier.__doc__ or "") + "\n\n" + inspect.cleandoc(options)
    sig = inspect.signature(outgoing)
    self = inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)
    front.__signature__ = sig.replace(  # type: ignore[attr-defined]
        parameters=[self, *sig.parameters.values()], return_annotation=None
    )


def _carrying(
    build: Callable[P, Outgoing],
) -> Callable[[Callable[[T, Outgoing], None]], Callable[Concatenate[T, P], None]]:
    def publishes(carrier: Callable[[T, Outgoing], None]) -> Callable[Concatenate[T, P], None]:
        def publish(self: T, /, *args: P.args, **options: P.kwargs) -> None:
            carrier(self, build(*args, **options))

        _front(carrier, publish)
        return publish

    return publishes


def _acarrying(
    build: Callable[P, Outgoing],
) -> Callable[
    [Callable[[T, Outgoing], Awaitable[None]]],
    Callable[Concatenate[T, P], Coroutine[Any, Any, None]],
]:
    def apublishes(
        carrier: Callable[[T, Outgoing], Awaitable[None]],
    ) -> Callable[Concatenate[T, P], Coroutine[Any, Any, None]]:
        async def publish(self: T, /, *args: P.args, **options: P.kwargs) -> None:
            await carrier(self, build(*args, **options))

        _front(carrier, publish)
        return publish

    return apublishes


publishes = _carrying(outgoing)
"""Decorate a carrier, `def publish(self, msg: Outgoing) -> None` (put `msg` on the wire,
wait for the broker's confirm, raise what `failure()` says), into the publish front:
a method that takes outgoing()'s arguments, builds the message, then carries it."""
apublishes = _acarrying(outgoing)
"""`publishes` for a coroutine carrier, `async def publish(self, msg: Outgoing)`."""


class Repliable(Protocol):
    """What `reply` reads of the delivery it answers (delivery.DeliveryBase)."""

    @property
    def properties(self) -> Any:
        """The AMQP basic properties (reply_to, correlation_id)."""
        ...

    @property
    def message_id(self) -> str | None:
        """The message_id property, None when the publisher set none."""
        ...


def reply(delivery: Repliable, body: object, **options: Any) -> Outgoing:
    """The reply to `delivery`: to its reply_to queue (default exchange), with its
    correlation_id (or, without one, its message_id) unless `options` set another."""
    to = getattr(delivery.properties, "reply_to", None)
    if not to:
        raise ValueError(
            f"cannot reply to {delivery!r}: it has no reply_to property (the sender did not "
            "ask for a reply); publish the result with publish(...) instead"
        )
    options.setdefault(
        "correlation_id",
        getattr(delivery.properties, "correlation_id", None) or delivery.message_id,
    )
    return outgoing(str(to), body, **options)


def failure(
    msg: Outgoing, *, confirmed: bool, returned: bool, why: str = ""
) -> PublishError | None:
    """What a publisher's outcome means for its caller: None when the broker confirmed
    a routed message; else the error to raise. `why` (not empty) says the outcome is
    unknown: no confirm came (timeout, connection lost)."""
    if why:
        return not_confirmed(msg, why)
    if returned:
        return MessageUnroutable(
            f"publish to {msg.where} was returned by the broker: no queue is bound to take it"
        )
    if not confirmed:
        return PublishNacked(f"publish to {msg.where} was refused by the broker (basic.nack)")
    return None


EXCHANGE_CHANNELS = 4
"""How many exchanges an app's messages get a publishing channel of their own for, at
most (fewer when the connection's channel_max leaves fewer spare: `spare_channels`)."""


def channel_for(exchange: str, open_keys: Collection[str], limit: int = EXCHANGE_CHANNELS) -> str:
    """Which of an app's publishing channels (by key) a message to `exchange` goes on.

    The broker answers a publish to a missing exchange (404), or to one the user may not
    write to (403), by closing the channel it came on, losing the confirms of every
    other publish on it. So the first `limit` exchanges an app publishes to get a
    channel each, and a bad one fails only its own messages; the others share the
    default exchange's channel ("")."""
    own = len(open_keys) - ("" in open_keys)  # exchanges with a channel of their own
    if exchange in open_keys or own < limit:
        return exchange
    return ""


def not_confirmed(msg: Outgoing, why: str) -> PublishNotConfirmed:
    return PublishNotConfirmed(f"publish to {msg.where} not confirmed: {why}")
