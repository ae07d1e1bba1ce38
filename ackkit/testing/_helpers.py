"""Test helpers on every broker handle (a real broker's and the in-memory one's).

publish a message (JSON, a pydantic model, text or raw bytes with properties
and headers), read a queue or a dead-letter queue (each dead letter read by the
DLQ tool's total reader, `ackkit.dead_letters._letter.describe`), and wait for queue
counts or any condition, blocking or with `await`.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from .._core import wire
from .._core.errors import MessageUnroutable
from ..dead_letters._letter import DeadLetter, describe
from ._errors import BrokerError
from ._queries import QueueCounts

__all__ = [
    "KitHelpers",
    "MessageProperties",
    "NotRouted",
    "QueuedMessage",
    "wait_until",
    "wait_until_async",
]

M = TypeVar("M")

_PROPERTY_NAMES = tuple(n for n in wire.PROPERTY_NAMES if n not in ("headers", "cluster_id"))
"""The properties a test reads of a message besides its headers (AMQP 0-9-1 retired cluster_id)."""


class NotRouted(BrokerError, MessageUnroutable):
    """A test published a message no queue took (no such queue, or no binding matched);
    also a `MessageUnroutable`, what every other publish front raises."""


class MessageProperties(dict[str, Any]):
    """A message's AMQP properties that were set, as a dict, and read like a handler's
    ``delivery.properties``: ``m.properties.reply_to`` (None when not set), so an
    assertion reads the same on both. ``.headers`` are the message's headers."""

    def __init__(self, fields: dict[str, Any], headers: dict[str, Any] | None = None) -> None:
        super().__init__(fields)
        self._headers = headers or {}

    def __getattr__(self, name: str) -> Any:
        if name == "headers":
            return self._headers
        if name in _PROPERTY_NAMES:
            return self.get(name)
        raise AttributeError(f"no AMQP property {name!r}; they are {', '.join(_PROPERTY_NAMES)}")


@dataclass(frozen=True)
class QueuedMessage:
    """A message read from a queue: body, headers and the other properties."""

    body: bytes
    headers: dict[str, Any]
    properties: MessageProperties
    """The properties that were set: a dict, also read as attributes like a handler's
    ``delivery.properties`` (``m.properties.correlation_id``)."""
    exchange: str = ""
    routing_key: str = ""
    redelivered: bool = False
    dead_letter: DeadLetter | None = field(default=None, repr=False)
    """What the message says about its death (`dead_letters()` only)."""

    def json(self) -> Any:
        """The body parsed as JSON."""
        return json.loads(self.body)

    def text(self) -> str:
        return self.body.decode("utf-8")

    def model(self, cls: type[M]) -> M:
        """The body validated as the pydantic model `cls`."""
        return cls.model_validate_json(self.body)  # type: ignore[attr-defined,no-any-return]

    @property
    def reason(self) -> str | None:
        """Why it was dead-lettered (`dead_letters()` only)."""
        return self.dead_letter.reason if self.dead_letter is not None else None


class KitHelpers:
    """publish / messages / dead_letters / waits, on top of a handle's `connect()` and
    `counts()` (both the real broker's `BrokerHandle` and `InMemoryBroker`)."""

    kind = "?"

    def connect(self, **overrides: Any) -> Any:
        raise NotImplementedError

    def counts(self, queue: str) -> QueueCounts:
        raise NotImplementedError

    def _reading_connection(self) -> Any:
        """The connection `messages()` / `dead_letters()` read with: one that keeps each
        message's headers as they were on the wire (pika alone reads a float as an int)."""
        from .._sync._pika import blocking_connection

        return blocking_connection(self.connection_parameters())

    def connection_parameters(self, **overrides: Any) -> Any:
        raise NotImplementedError

    def publish(
        self,
        routing_key: str,
        message: Any,
        *,
        exchange: str = "",
        headers: Mapping[str, Any] | None = None,
        mandatory: bool = True,
        **properties: Any,
    ) -> None:
        """Publish one message (with publisher confirms) and return once the broker took it.

        The message is built as `App.publish` builds it (the same call, the same message
        on the wire; the defaults: `ackkit._messages.publish`): a pydantic model or any JSON-able
        value as application/json, bytes and str as they are without a content type, a
        new message_id, persistent. `properties`: the other options of `App.publish`
        and AMQP basic properties by pika's names (message_id, correlation_id,
        content_type, reply_to, expiration, ...; `delivery_mode=1` is
        `persistent=False`). With `mandatory` (the default) a message no queue takes
        raises NotRouted: a test publishing to a queue nobody declared fails at once
        instead of waiting for nothing.
        """
        self.publish_many(
            routing_key,
            [message],
            exchange=exchange,
            headers=headers,
            mandatory=mandatory,
            **properties,
        )

    def publish_many(
        self,
        routing_key: str,
        messages: list[Any],
        *,
        exchange: str = "",
        headers: Mapping[str, Any] | None = None,
        mandatory: bool = True,
        **properties: Any,
    ) -> None:
        """`publish` for several messages over one connection, in order."""
        from .._messages.publish import outgoing
        from .._sync.publisher import carry

        if "delivery_mode" in properties:
            properties["persistent"] = properties.pop("delivery_mode") != 1
        built = [
            outgoing(
                routing_key,
                m,
                exchange=exchange,
                headers=headers,
                mandatory=mandatory,
                **properties,
            )
            for m in messages
        ]
        conn = self.connect()
        try:
            ch = conn.channel()
            ch.confirm_delivery()
            for msg in built:
                try:
                    carry(ch, msg)
                except MessageUnroutable:
                    where = f"exchange {exchange!r}" if exchange else "the default exchange"
                    raise NotRouted(
                        f"no queue took a message published to {where} with routing key "
                        f"{routing_key!r} (declare the queue, or start the app first)"
                    ) from None
        finally:
            conn.close()

    def messages(self, queue: str, *, take: bool = False) -> list[QueuedMessage]:
        """The ready messages of `queue`, oldest first: left in place (requeued, so they
        come back marked redelivered), or removed with `take=True`."""
        return [m for m in self._read(queue, take=take, dead=False)]

    def dead_letters(self, queue: str, *, take: bool = False) -> list[QueuedMessage]:
        """The messages of the dead-letter queue `queue` (e.g. "orders.dlq"), each with
        `.dead_letter` read from its headers (reason, error type and message, attempts,
        original queue: as `ackkit dlq inspect` shows them) and `.reason`."""
        return self._read(queue, take=take, dead=True)

    def _read(self, queue: str, *, take: bool, dead: bool) -> list[QueuedMessage]:
        from .._sync._pika import read_headers

        out: list[QueuedMessage] = []
        conn = self._reading_connection()
        try:
            ch = conn.channel()
            while True:
                method, props, body = ch.basic_get(queue, auto_ack=take)
                if method is None:
                    break
                headers = read_headers(props)
                fields = {n: getattr(props, n, None) for n in _PROPERTY_NAMES}
                letter = None
                if dead:
                    letter = describe(
                        headers,
                        message_id=props.message_id,
                        body_size=len(body),
                        redelivered=method.redelivered,
                    )
                out.append(
                    QueuedMessage(
                        bytes(body),
                        headers,
                        MessageProperties(
                            {k: v for k, v in fields.items() if v is not None}, headers
                        ),
                        method.exchange or "",
                        method.routing_key or "",
                        bool(method.redelivered),
                        letter,
                    )
                )
            if out and not take:
                ch.basic_nack(0, multiple=True, requeue=True)
        finally:
            conn.close()
        return out

    async def wait_for_async(
        self,
        queue: str,
        *,
        ready: int | None = None,
        unacked: int | None = None,
        total: int | None = None,
        consumers: int | None = None,
        timeout: float = 10.0,
        interval: float = 0.02,
    ) -> QueueCounts:
        """`wait_for` for async tests: polls without blocking the event loop."""
        want = wanted_counts(ready, unacked, total, consumers)
        last: list[QueueCounts | str] = ["no answer yet"]

        async def check() -> bool:
            from ._errors import QueueNotFound

            try:
                if self.kind == "memory":
                    c = self.counts(queue)
                else:
                    c = await asyncio.to_thread(self.counts, queue)
            except QueueNotFound as exc:
                last[0] = str(exc)
                return False
            last[0] = c
            return counts_reached(c, want)

        try:
            await wait_until_async(check, timeout=timeout, interval=interval)
        except AssertionError:
            raise counts_not_reached(queue, want, timeout, last[0]) from None
        result = last[0]
        assert isinstance(result, QueueCounts)
        return result


def wanted_counts(
    ready: int | None, unacked: int | None, total: int | None, consumers: int | None
) -> dict[str, int]:
    """The counts a `wait_for` waits for: those it was given."""
    want = {"ready": ready, "unacked": unacked, "total": total, "consumers": consumers}
    return {k: v for k, v in want.items() if v is not None}


def counts_reached(counts: QueueCounts, want: Mapping[str, int]) -> bool:
    """Whether `counts` show every count of `want`."""
    return all(getattr(counts, k) == v for k, v in want.items())


def counts_not_reached(
    queue: str, want: Mapping[str, int], timeout: float, last: QueueCounts | str
) -> AssertionError:
    """What a `wait_for` raises when `queue` did not reach `want` (`last`: what it saw)."""
    return AssertionError(
        f"queue {queue!r} did not reach {dict(want)} within {timeout:.1f}s; last: {last}"
    )


def wait_until(
    check: Callable[[], object], *, timeout: float = 10.0, interval: float = 0.02, what: str = ""
) -> None:
    """Call `check` until it returns something true; AssertionError after `timeout` s."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.1f}s waiting for {what or check}")
        time.sleep(interval)


async def wait_until_async(
    check: Callable[[], object | Awaitable[object]],
    *,
    timeout: float = 10.0,
    interval: float = 0.02,
    what: str = "",
) -> None:
    """`wait_until` for async tests: `check` may be a plain or an async function."""
    deadline = time.monotonic() + timeout
    while True:
        ok = check()
        if inspect.isawaitable(ok):
            ok = await ok
        if ok:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.1f}s waiting for {what or check}")
        await asyncio.sleep(interval)
