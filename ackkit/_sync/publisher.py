"""The confirm-mode channel that publishes the copies the core asks for, and the app's
own messages (`App.publish`, `Delivery.publish` / `reply`).

One for each listener's copies (the App's consumers, the Spark source), and one for
the app's own messages: a handler's publish the broker answers with a channel
close (a missing exchange: 404) closes that channel only, never the one another
listener's copies are waiting on. Retry copies and dead letters are published with `mandatory`,
so a copy no queue takes comes back with basic.return; each publish is then
confirmed (basic.ack) or refused (basic.nack), and the listener's core decides
what that means for the original (`ListenerCore.republished`). An app message
goes the same way; its `Ticket` tells the waiting caller how it ended.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import pika.exceptions
from pika.spec import Basic

from .._core.actions import Republish
from .._core.errors import PublishError
from .._messages.publish import Outgoing, failure
from .._telemetry.logs import short
from . import _frames as frames
from ._pika import WireProperties, copy_options, copy_properties
from .executor import Executor

log = logging.getLogger("ackkit")


class Host(Protocol):
    """What the publisher needs of the engine that owns its connection."""

    @property
    def connection(self) -> Any: ...

    @property
    def stopping(self) -> bool: ...

    def channels_lost(self, reason: BaseException, /) -> None: ...


@dataclass(slots=True)
class Pending:
    """A publish not yet confirmed; `done(confirmed, returned, lost)` is called once: when
    the broker answered, or when the channel closed first (lost: the close's reason)."""

    done: Callable[[bool, bool, str | None], None]
    exchange: str
    routing_key: str
    body: bytes
    returned: bool = False
    copy: bool = True


def returned_publish(
    pending: Mapping[int, Pending], exchange: str, routing_key: str, body: bytes
) -> int | None:
    """The publish (sequence number) a basic.return is about, or None.

    The broker handles a channel's publishes in order and sends a publish's basic.return
    before its basic.ack, so the return belongs to an unconfirmed publish to the same
    exchange and routing key, not returned yet: the oldest such one. An older publish to
    the same place may still wait for its confirm although it was routed (the queue was
    deleted in between), so the body must match as well. Only two such copies with the
    same body stay ambiguous: the older is marked (its original is copied once more, the
    younger's original is acked: the target holds that body twice either way)."""
    fallback = None
    for seq in sorted(pending):
        p = pending[seq]
        if not p.returned and p.exchange == exchange and p.routing_key == routing_key:
            if p.body == body:
                return seq
            if fallback is None:
                fallback = seq
    return fallback


LOST = "the connection or channel closed before the broker confirmed it"


class Ticket:
    """An app message handed to the I/O thread, and the caller waiting for its outcome.

    Until the I/O thread sends it, the caller may withdraw it (`withdraw()` after a
    timeout): a withdrawn message is never sent, so "not confirmed" then means "not
    published"; once sent, the outcome is the broker's."""

    def __init__(self, msg: Outgoing) -> None:
        self.msg = msg
        self.sent = False
        self.error: PublishError | None = None
        self._withdrawn = False
        self._lock = threading.Lock()
        self._done = threading.Event()

    def take(self) -> bool:
        """I/O thread, about to send: False if the caller gave up already."""
        with self._lock:
            if self._withdrawn:
                return False
            self.sent = True
            return True

    def withdraw(self) -> bool:
        """Caller: give up; True if the message was never sent (and never will be)."""
        with self._lock:
            self._withdrawn = True
            return not self.sent

    def finish(self, confirmed: bool, returned: bool, why: str = "") -> None:
        self.error = failure(self.msg, confirmed=confirmed, returned=returned, why=why)
        self._done.set()

    def wait(self, timeout: float) -> bool:
        return self._done.wait(timeout)


class Publisher:
    """A confirm-mode channel for the copies of deliveries (retry delays, dead letters)."""

    def __init__(self, host: Host) -> None:
        self.host = host
        self.channel: Any = None
        self.seq = 0
        self.pending: dict[int, Pending] = {}
        # Copies waiting for the channel to be ready, and for a queue to be declared.
        self.waiting: list[tuple[Executor, int, Republish]] = []
        self.tickets: list[Ticket] = []  # app messages waiting for the channel
        self.declaring: list[tuple[Executor, int, Republish]] = []

    def open(self, conn: Any) -> None:
        conn.channel(on_open_callback=self._on_open)

    def _reopen(self, conn: Any) -> None:
        if conn.is_open and not self.host.stopping and self.channel is None:
            self.open(conn)

    def _on_open(self, ch: Any) -> None:
        ch.add_on_close_callback(self._on_closed)
        ch.add_on_return_callback(self._on_return)
        ch.confirm_delivery(self._on_confirm, callback=lambda _f: self._ready(ch))

    def _ready(self, ch: Any) -> None:
        self.channel = ch
        self.seq = 0
        waiting, self.waiting = self.waiting, []
        for owner, gen, a in waiting:
            self.publish(owner, gen, a)
        tickets, self.tickets = self.tickets, []
        for t in tickets:
            self.send(t)

    def send(self, t: Ticket) -> None:
        """Publish an app message (I/O thread); `t.finish(...)` once the broker answered."""
        ch = self.channel
        if ch is None or not ch.is_open:
            self.tickets.append(t)
            return
        if not t.take():
            return
        m = t.msg
        try:
            ch.basic_publish(
                m.exchange, m.routing_key, m.body, WireProperties(m.properties), m.mandatory
            )
        except Exception as exc:  # a closed channel: the message did not go out
            t.finish(False, False, f"not sent: {short(exc)}")
            return
        self.seq += 1
        self.pending[self.seq] = Pending(
            lambda ok, returned, lost: t.finish(ok, returned, f"{LOST}: {lost}" if lost else ""),
            m.exchange,
            m.routing_key,
            m.body,
            copy=False,
        )

    def publish(self, owner: Executor, gen: int, a: Republish) -> None:
        """Publish the copy `a` of one of `owner`'s deliveries (I/O thread)."""
        with owner.lock:
            current = owner.core.publishable(a.token)
        if not current:  # the original's channel closed since: the broker requeued it
            owner.republished(gen, a.token, False)
            return
        ch = self.channel
        if ch is None or not ch.is_open:
            self.waiting.append((owner, gen, a))
            return
        if a.declare is not None:
            # The core asks for one of its own queues to be declared first (the copy
            # came back unroutable: e.g. the dead-letter queue did not exist yet).
            name, args = a.declare
            entry = (owner, gen, dataclasses.replace(a, declare=None))
            self.declaring.append(entry)

            def declared(_frame: Any) -> None:
                if any(e is entry for e in self.declaring):
                    self.declaring.remove(entry)
                    self.publish(*entry)

            ch.queue_declare(name, durable=True, arguments=args or None, callback=declared)
            return
        try:
            props, body = owner.original(a)
            copy = copy_properties(
                None if a.minimal else props, a.set_headers, **copy_options(a, ch)
            )
            ch.basic_publish(a.exchange, a.routing_key, body, copy, mandatory=True)
        except Exception as exc:  # never lose the I/O thread over one copy
            if not ch.is_open:  # closed under us: not sent; the core sends it once more
                owner.republished(gen, a.token, False, lost=f"not sent: {short(exc)}")
                return
            why = f"{a.purpose} copy not publishable: {short(exc)}"
            owner.log.error("%s: %s", owner.name, why)
            owner.republish_failed(a.token, why)
            return
        self.seq += 1
        self.pending[self.seq] = Pending(
            lambda ok, returned, lost: owner.republished(gen, a.token, ok, returned, lost),
            a.exchange,
            a.routing_key,
            body,
        )

    def _on_return(self, ch: Any, method: Any, props: Any, body: bytes) -> None:
        exchange, rk = frames.text(method.exchange), frames.text(method.routing_key)
        seq = returned_publish(self.pending, exchange, rk, body)
        if seq is not None:
            self.pending[seq].returned = True
            if not self.pending[seq].copy:
                return  # an app message: its caller gets MessageUnroutable
        log.warning(
            "copy published to %r returned by the broker: %s (an ackkit queue is declared "
            "again and the copy republished; otherwise the original is requeued)",
            rk,
            method.reply_text,
        )

    def _on_confirm(self, frame: Any) -> None:
        m = frame.method
        ok = isinstance(m, Basic.Ack)
        tags = [s for s in self.pending if s <= m.delivery_tag] if m.multiple else [m.delivery_tag]
        for s in tags:
            p = self.pending.pop(s, None)
            if p is not None:
                p.done(ok and not p.returned, p.returned, None)

    def _on_closed(self, ch: Any, reason: BaseException) -> None:
        if self.channel is not None and ch is not self.channel:
            return  # an earlier channel's late callback
        self.channel = None
        conn = self.host.connection
        if conn is None or not conn.is_open:
            # The whole connection is going down (pika closes its channels in number
            # order, maybe this one first): the listeners' channels are gone as well, so
            # their deliveries are stale before the unconfirmed copies are reported.
            self.host.channels_lost(reason)
        pending, self.pending = self.pending, {}
        declaring, self.declaring = self.declaring, []
        why = short(reason)
        for p in pending.values():
            p.done(False, False, why)
        for owner, gen, a in declaring:
            owner.republished(gen, a.token, False, lost=why)
        if not self.host.stopping and conn is not None and conn.is_open:
            log.warning("publisher channel closed: %s; reopening", reason)
            conn.ioloop.call_later(0.5, lambda: self._reopen(conn))


def carry(ch: Any, msg: Outgoing) -> None:
    """The blocking carrier: publish a built message on a pika BlockingChannel in confirm
    mode (pull mode, the test kit) and wait for the broker's answer; the PublishError its
    outcome means (`failure`), if any. (The App's messages take `Publisher.send`.)"""
    confirmed, returned = True, False
    try:
        ch.basic_publish(
            msg.exchange,
            msg.routing_key,
            msg.body,
            WireProperties(msg.properties),
            mandatory=msg.mandatory,
        )
    except pika.exceptions.UnroutableError:
        returned = True
    except pika.exceptions.NackError:
        confirmed = False
    error = failure(msg, confirmed=confirmed, returned=returned)
    if error is not None:
        raise error


class BlockingCopies:
    """The confirm channel pull mode publishes its copies on (retry delays, dead letters):
    `Publisher.publish` on a blocking connection, for the same executor. A channel of its
    own, as the App's publisher has, so a copy the broker answers with a channel close (a
    missing exchange: 404) never closes the channel the deliveries were fetched on."""

    def __init__(self) -> None:
        self.channel: Any = None

    def publish(self, owner: Executor, gen: int, a: Republish) -> None:
        """Publish the copy `a` of one of `owner`'s deliveries, confirmed, on `owner`'s
        blocking connection, and tell `owner` how it ended (its core decides what now,
        as for `Publisher.publish`). A lost connection raises."""
        with owner.lock:
            current = owner.core.publishable(a.token)
        if not current:  # the original's channel closed since: the broker requeued it
            owner.republished(gen, a.token, False)
            return
        conn = owner.io.connection
        ok = unroutable = False
        lost = None
        try:
            ch = self.channel
            if ch is None or not ch.is_open:
                ch = self.channel = conn.channel()
                ch.confirm_delivery()
            if a.declare is not None:
                name, args = a.declare
                ch.queue_declare(name, durable=True, arguments=args or None)
            props, body = owner.original(a)
            copy = copy_properties(
                None if a.minimal else props, a.set_headers, **copy_options(a, ch._impl)
            )
            ch.basic_publish(a.exchange, a.routing_key, body, copy, mandatory=True)
            ok = True
        except pika.exceptions.UnroutableError:
            unroutable = True
        except pika.exceptions.NackError:
            pass
        except (pika.exceptions.AMQPError, ValueError, TypeError, LookupError) as exc:
            if not conn.is_open:
                raise
            if self.channel is None or self.channel.is_open:
                why = f"{a.purpose} copy not publishable: {short(exc)}"
                log.error("copy to %r: %s", a.routing_key, why)
                owner.republish_failed(a.token, why)
                return
            lost = short(exc)  # the broker closed the copies' channel: sent again
            log.error("copy to %r: %s", a.routing_key, lost)
        owner.republished(gen, a.token, ok, unroutable, lost)
