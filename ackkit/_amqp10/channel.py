"""A channel over AMQP 1.0: one session, with the calls the App's runtime makes of a
pika channel (`ackkit._sync`: the consumer, the executor, the publisher).

- `basic_consume` attaches a receiver link to ``/queues/<queue>``. Its credit is the
  prefetch: granted when the link opens, then topped up as deliveries are settled, so
  at most `prefetch` are unsettled, as with 0-9-1's basic.qos (proton's own flow
  control grants credit on arrival instead, which bounds nothing). A prefetch of 0
  grants `UNBOUNDED` at a time.
- Delivery tags are this channel's, counted from 1 as the broker's are on a 0-9-1
  channel; `basic_ack`, `basic_nack` and `basic_reject` with `multiple` settle every
  unsettled delivery up to the tag. `settle(action)` settles with the outcome the core's
  rule gives (`ackkit._core.settlement`): the executor calls it instead of the three.
- `basic_cancel` drains the link's credit (no more deliveries once the broker answered)
  and keeps the link, so that what it delivered can still be settled; the link is
  detached once nothing on it is unsettled, or with the session.
- A consumer the broker refuses (the attach answered, then a detach with an error: a
  missing queue, an exclusive one in use) closes the channel with 0-9-1's reply code
  for it, as a refused basic.consume does; a consumer the broker ends (its queue was
  deleted) is a basic.cancel from the broker.
- After RabbitMQ ended a connection on a message it could not convert for AMQP 1.0
  (`ackkit._core.conversion`), a consumer of the next connection first takes the head
  of its queue over AMQP 0-9-1 (`fallback`): those deliveries reach the consumer as any
  other, and are settled on that 0-9-1 channel; its link is granted credit after.
- `confirm_delivery` attaches an anonymous sender link; `basic_publish` sends unsettled
  to the publish's address, and the broker's outcome is the confirm: `accepted` an
  ack, `released` (no queue took it) a basic.return then an ack, `rejected` or
  `modified` a nack.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pika
import pika.exceptions
import pika.frame
import pika.spec
from proton import Condition, Delivery, Link, Message, int32, symbol

from .._core import amqp10, conversion
from .._core.actions import Ack, Nack, Reject
from .._core.settlement import Outcome, outcome
from .._core.settlement import redelivered as was_delivered
from .._sync._frames import UnreadableProperties
from . import fallback, messages

if TYPE_CHECKING:
    from .connection import Connection

log = logging.getLogger("ackkit")

UNBOUNDED = 1000
"""The credit a consumer with prefetch 0 (no limit) is granted at a time."""

_CODES = {
    "amqp:not-found": 404,
    "amqp:resource-locked": 405,
    "amqp:unauthorized-access": 403,
    "amqp:precondition-failed": 406,
    "amqp:resource-limit-exceeded": 406,
    "amqp:not-allowed": 403,
    "amqp:resource-deleted": 404,
}
_NAMES = {
    320: "CONNECTION_FORCED",
    403: "ACCESS_REFUSED",
    404: "NOT_FOUND",
    405: "RESOURCE_LOCKED",
    406: "PRECONDITION_FAILED",
    541: "INTERNAL_ERROR",
}
_STATES = {
    Outcome.ACCEPTED: Delivery.ACCEPTED,
    Outcome.RELEASED: Delivery.RELEASED,
    Outcome.MODIFIED: Delivery.MODIFIED,
    Outcome.REJECTED: Delivery.REJECTED,
}


class _Garbled:
    """An error condition proton could not read (its description not UTF-8: RabbitMQ
    echoes a hostile message's bytes in some): its name and what could be said."""

    def __init__(self, exc: Exception) -> None:
        self.name = "amqp:internal-error"
        self.description = f"an error whose text could not be read ({type(exc).__name__})"


def condition_of(endpoint: Any, attr: str = "remote_condition") -> Any:
    """`endpoint`'s error condition (a link's, a session's, a connection's, a transport's),
    never raising: a condition proton cannot decode must not end ackkit's I/O thread."""
    try:
        return getattr(endpoint, attr)
    except Exception as exc:  # UnicodeDecodeError, seen; anything else alike
        return _Garbled(exc)


def reply_code(condition: Condition | None) -> tuple[int, str]:
    """0-9-1's (reply code, text) for an AMQP 1.0 error condition: the text as RabbitMQ
    words it over 0-9-1 ("NOT_FOUND - no queue ..."), with the AMQP 1.0 condition after
    it, so a log line reads the same over either protocol."""
    if condition is None:
        return 320, "CONNECTION_FORCED - detached by the broker"
    name = str(condition.name)
    code = _CODES.get(name, 541)
    return code, f"{_NAMES[code]} - {condition.description or ''} ({name})"


class _Method:
    """What a consumer reads of a delivery's basic.deliver."""

    __slots__ = ("delivery_count", "delivery_tag", "exchange", "redelivered", "routing_key")

    def __init__(
        self, tag: int, count: int | None, redelivered: bool, exchange: str, routing_key: str
    ) -> None:
        self.delivery_tag = tag
        self.delivery_count = count
        self.redelivered = redelivered
        self.exchange = exchange
        self.routing_key = routing_key


class _Consumer:
    """One receiver link: its callback, its credit, whether it was cancelled."""

    __slots__ = (
        "auto_ack",
        "cancel_ok",
        "cancelled",
        "delivered",
        "fetch",
        "link",
        "on_message",
        "queue",
        "ready",
        "unsettled",
    )

    def __init__(
        self, link: Any, queue: str, on_message: Callable[..., None], auto_ack: bool
    ) -> None:
        self.link = link
        self.queue = queue
        self.on_message = on_message
        self.auto_ack = auto_ack
        self.ready: Callable[[Any], None] | None = None  # consume-ok, until it came
        self.cancelled = False
        self.cancel_ok: Callable[[Any], None] | None = None
        self.unsettled = 0
        self.fetch = 0  # messages to take over AMQP 0-9-1 first; no credit until then
        self.delivered = 0  # of them, how many the connection that ended had delivered


class Channel:
    """A session, as a pika channel (see the module's docstring)."""

    def __init__(self, conn: Connection, number: int, on_open: Callable[[Any], None]) -> None:
        self.connection = conn
        self.channel_number = number
        self.session = conn.proton.session()
        self.session.context = self
        self._on_open: Callable[[Any], None] | None = on_open
        self.is_open = False
        self.is_closed = False
        self._closing = False
        self._close_callbacks: list[Callable[[Any, BaseException], None]] = []
        self._cancel_callbacks: list[Callable[[Any], None]] = []
        self._return_callbacks: list[Callable[..., None]] = []
        self.prefetch = 0
        self._tags = itertools.count(1)
        self.unsettled: dict[int, tuple[Any, _Consumer]] = {}  # tag -> (delivery, consumer)
        self.consumers: dict[str, _Consumer] = {}
        self._names = itertools.count(1)
        # publishing
        self.sender: Any = None
        self._on_confirm: Callable[[Any], None] | None = None
        self._confirm_ready: Callable[[Any], None] | None = None
        self._seq = 0
        self._sent: dict[Any, tuple[int, str, str, bytes, Any, bool]] = {}
        self.session.open()

    # -- pika's channel calls -------------------------------------------------------

    def add_on_close_callback(self, cb: Callable[[Any, BaseException], None]) -> None:
        self._close_callbacks.append(cb)

    def add_on_cancel_callback(self, cb: Callable[[Any], None]) -> None:
        self._cancel_callbacks.append(cb)

    def add_on_return_callback(self, cb: Callable[..., None]) -> None:
        self._return_callbacks.append(cb)

    def basic_qos(
        self, prefetch_count: int = 0, callback: Callable[[Any], None] | None = None, **_: Any
    ) -> None:
        """The credit of the consumers this channel attaches from now on (no round trip:
        `callback` runs on the loop's next turn)."""
        self.prefetch = prefetch_count
        if callback is not None:
            self.connection.ioloop.call_later(0, lambda: callback(None))

    def basic_consume(
        self,
        queue: str,
        on_message_callback: Callable[..., None],
        auto_ack: bool = False,
        exclusive: bool = False,
        consumer_tag: str | None = None,
        arguments: dict[str, Any] | None = None,
        callback: Callable[[Any], None] | None = None,
    ) -> str:
        # unique on the connection: a second link of the same name closes it
        n = next(self._names)
        tag = consumer_tag or f"ackkit-{self.connection.proton.container}-{self.channel_number}-{n}"
        link = self.session.receiver(tag)
        link.source.address = messages.queue_address(queue)
        link.rcv_settle_mode = Link.RCV_FIRST
        if auto_ack:
            link.snd_settle_mode = Link.SND_SETTLED
        props: dict[Any, Any] = {}
        priority = (arguments or {}).get("x-priority")
        if priority is not None:
            props[symbol("rabbitmq:priority")] = int32(int(priority))  # an AMQP int, not a long
        if props:
            link.properties = props
        c = _Consumer(link, queue, on_message_callback, auto_ack)
        c.ready = callback
        c.fetch, c.delivered = fallback.SUSPECTS.take(self.connection.params, queue)
        link.context = c
        self.consumers[tag] = c
        link.open()
        return tag

    def basic_cancel(
        self, consumer_tag: str, callback: Callable[[Any], None] | None = None
    ) -> None:
        c = self.consumers.get(consumer_tag)
        if c is None or c.cancelled:
            if callback is not None:
                self.connection.ioloop.call_later(0, lambda: callback(None))
            return
        c.cancelled = True
        c.cancel_ok = callback
        link = c.link
        if link.state & Link.REMOTE_ACTIVE and link.state & Link.LOCAL_ACTIVE:
            link.drain(0)  # the broker answers with its credit used up or given back
            if link.credit == 0 and not link.drain_mode:
                self._drained(c)
        else:
            self._drained(c)

    def settle(self, action: Ack | Nack | Reject) -> None:
        """Settle the delivery of `action` (with `multiple`, every unsettled one up to it)
        with the outcome the core's rule gives."""
        state = _STATES[outcome(action)]
        multiple = type(action) is not Reject and action.multiple  # type: ignore[union-attr]
        self._settle(action.tag, multiple, state)

    def basic_ack(self, delivery_tag: int = 0, multiple: bool = False) -> None:
        self.settle(Ack(delivery_tag, multiple))

    def basic_nack(
        self, delivery_tag: int = 0, multiple: bool = False, requeue: bool = True
    ) -> None:
        self.settle(Nack(delivery_tag, multiple, requeue))

    def basic_reject(self, delivery_tag: int = 0, requeue: bool = True) -> None:
        self.settle(Reject(delivery_tag, requeue))

    def confirm_delivery(
        self,
        ack_nack_callback: Callable[[Any], None],
        callback: Callable[[Any], None] | None = None,
    ) -> None:
        snd = self.session.sender(
            f"ackkit-pub-{self.connection.proton.container}-{self.channel_number}"
        )
        # no target address (anonymous): each message says where it goes
        snd.snd_settle_mode = Link.SND_UNSETTLED
        snd.context = self
        self.sender = snd
        self._on_confirm = ack_nack_callback
        self._confirm_ready = callback
        snd.open()

    def basic_publish(
        self,
        exchange: str,
        routing_key: str,
        body: bytes,
        properties: Any = None,
        mandatory: bool = False,
    ) -> None:
        if not self.is_open or self.sender is None:
            raise pika.exceptions.ChannelWrongStateError("channel is closed")
        mapping = getattr(properties, "mapping", None)
        if mapping is None:
            from .._sync._pika import property_map

            mapping = property_map(properties)
        msg = messages.message_of(mapping, body, exchange, routing_key)
        self._seq += 1
        dlv = self.sender.send(msg)
        self._sent[dlv.tag] = (self._seq, exchange, routing_key, body, properties, mandatory)

    def queue_declare(
        self,
        queue: str,
        durable: bool = True,
        arguments: dict[str, Any] | None = None,
        callback: Callable[[Any], None] | None = None,
        **_: Any,
    ) -> None:
        """Declared (durable, as every queue ackkit declares) on a short AMQP 0-9-1
        connection in a thread of its own (the loop goes on); `callback` on the loop once
        done. A refused declare closes this channel, as the broker's 406 or 403 would."""
        conn = self.connection

        def work() -> None:
            err: BaseException | None = None
            try:
                from .._sync._pika import blocking_connection

                bc = blocking_connection(conn.params)
                try:
                    bc.channel().queue_declare(queue, durable=True, arguments=arguments)
                finally:
                    if bc.is_open:
                        bc.close()
            except BaseException as exc:  # told to the channel, on the loop
                err = exc

            def done() -> None:
                if err is None:
                    if callback is not None and self.is_open:
                        callback(None)
                else:
                    code = getattr(err, "reply_code", 541)
                    self._closed_by(code, f"declaring queue {queue!r} failed: {err}")

            with contextlib.suppress(RuntimeError):  # gone: this channel went with it
                conn.ioloop.add_callback_threadsafe(done)

        threading.Thread(target=work, name="ackkit-amqp10-declare", daemon=True).start()

    def tx_select(self, callback: Callable[[Any], None] | None = None) -> None:
        raise pika.exceptions.ChannelWrongStateError(
            "AMQP 1.0 on RabbitMQ has no transactions (AckMode.SESSION_TRANSACTED)"
        )

    tx_commit = tx_select

    def close(self, reply_code: int = 200, reply_text: str = "Normal shutdown") -> None:
        if self.is_closed or self._closing:
            return
        self._closing = True
        for c in self.consumers.values():
            if c.link.state & Link.LOCAL_ACTIVE:
                c.link.close()
        if self.sender is not None and self.sender.state & Link.LOCAL_ACTIVE:
            self.sender.close()
        self.session.close()
        self._gone(pika.exceptions.ChannelClosedByClient(reply_code, reply_text))

    # -- the connection's handler calls these (I/O thread) --------------------------

    def opened(self) -> None:
        self.is_open = True
        cb, self._on_open = self._on_open, None
        if cb is not None:
            cb(self)

    def link_opened(self, link: Any) -> None:
        if link.is_sender:  # (proton's wrappers are new objects per event: no `is`)
            cb, self._confirm_ready = self._confirm_ready, None
            if cb is not None:
                cb(None)
            return
        c = link.context
        if not isinstance(c, _Consumer) or link.remote_source is None:
            return
        if not link.remote_source.address:
            return  # refused: the detach follows with the reason
        cb, c.ready = c.ready, None
        if cb is not None:
            cb(None)
        if c.fetch:
            self._fetch(c)
        else:
            self._grant(c)

    def link_closed(self, link: Any) -> None:
        code, text = reply_code(condition_of(link))
        if link.state & Link.LOCAL_ACTIVE:
            link.close()
        if link.is_sender:
            if not self._closing:
                self._closed_by(code, f"publisher link detached: {text}")
            return
        c = link.context
        if not isinstance(c, _Consumer):
            return
        if self._closing:
            return
        if c.ready is not None:  # never consumed: refused, as a basic.consume is
            self._closed_by(code, text)
            return
        if c.cancelled:
            self._forget(c)
            return
        # the broker ended a consumer it had accepted (its queue deleted): basic.cancel
        self._forget(c)
        frame = pika.frame.Method(
            self.channel_number, pika.spec.Basic.Cancel(consumer_tag=link.name)
        )
        for cb in list(self._cancel_callbacks):
            cb(frame)

    def link_flow(self, link: Any) -> None:
        c = link.context
        drained = isinstance(c, _Consumer) and c.cancelled and link.credit == 0
        if drained and c.cancel_ok is not None:
            self._drained(c)

    def delivery(self, dlv: Any) -> None:
        link = dlv.link
        if link.is_sender:
            self._outcome(dlv)
            return
        if dlv.aborted:  # the broker gave up sending it: nothing was delivered
            dlv.settle()
            return
        tag = getattr(dlv, "ackkit_tag", None)
        if tag is not None:
            if dlv.updated and dlv.remote_state is not None:
                self._taken_back(dlv, tag)
            return
        if not dlv.readable or dlv.partial:
            return
        c = link.context
        data = link.recv(dlv.pending)
        link.advance()
        tag = next(self._tags)
        msg = Message()
        count = 0
        redelivered = False
        try:
            msg.decode(data)
            count = int(msg.delivery_count or 0)
            acquired = symbol("x-acquired-count") in (msg.annotations or {})
            redelivered = was_delivered(count, bool(msg.first_acquirer), acquired)
            body = messages.body_of(msg)
            props, exchange, rk = messages.properties_of(msg)
        except messages.Unreadable as exc:  # its body: kept encoded on the dead letter
            props, _ = _salvage(bytes(data), str(exc))
            body = exc.body
            exchange = rk = ""
        except Exception as exc:  # never let one message take the connection down
            why = f"its AMQP 1.0 encoding could not be read: {exc}"
            props, body = _salvage(bytes(data), why)
            exchange = rk = ""
        if c.auto_ack or dlv.settled:
            dlv.settle()
        else:
            self.unsettled[tag] = (dlv, c)
            dlv.ackkit_tag = tag
            c.unsettled += 1
        c.on_message(self, _Method(tag, count, redelivered, exchange, rk), props, body)
        if c.auto_ack:
            self._grant(c)

    def _taken_back(self, dlv: Any, tag: int) -> None:
        """The broker settled a delivery this consumer still holds (RabbitMQ 4.3 releases
        it on a consumer timeout and delivers it again): as over 0-9-1, where the broker
        cancels the consumer then, its deliveries are fenced and the channel is renewed
        (`ListenerCore.consumer_cancelled`); a settle sent for it later is not seen."""
        entry = self.unsettled.get(tag)
        if entry is None or self._closing:
            return
        c = entry[1]
        log.info(
            "the broker settled delivery %d itself (%s): its consumer is renewed",
            tag,
            dlv.remote_state,
        )
        frame = pika.frame.Method(
            self.channel_number, pika.spec.Basic.Cancel(consumer_tag=c.link.name)
        )
        for cb in list(self._cancel_callbacks):
            cb(frame)

    def _fetch(self, c: _Consumer) -> None:
        """Take up to `c.fetch` messages of the consumer's queue over AMQP 0-9-1
        (`fallback.take`) and hand them to the consumer, on the loop; then grant the link
        its credit."""

        def deliver(got: list[tuple[Any, Any, bytes]], held: fallback.Held | None) -> None:
            c.fetch = 0
            if not self.is_open or c.cancelled:
                if held is not None:
                    held.close()  # gives them back
                return
            for i, (method, props, body) in enumerate(got):
                tag = next(self._tags)
                if held is not None:
                    self.unsettled[tag] = (fallback.Fetched(held, method.delivery_tag), c)
                    c.unsettled += 1
                again = conversion.redelivered(i, c.delivered, method.redelivered)
                m = _Method(tag, None, again, method.exchange, method.routing_key)
                c.on_message(self, m, props, body)
            self._grant(c)

        fallback.take(self.connection, c.queue, c.fetch, c.auto_ack, deliver)

    def closed_by_broker(self, condition: Condition | None) -> None:
        code, text = reply_code(condition)
        self._closed_by(code, text)

    def connection_lost(self, reason: BaseException, condition: Any = None) -> None:
        """The connection ended (`condition`: the broker's error condition, if it ended
        it): where it may have ended on a message the broker could not convert, the
        queues consumed here are taken over AMQP 0-9-1 first by the next connection."""
        if self.is_closed:
            return
        if condition is not None and conversion.unconvertible(
            str(condition.name), condition.description
        ):
            for c in self.consumers.values():
                if not c.cancelled:
                    n = conversion.taken_over_091(self.prefetch, c.unsettled)
                    fallback.SUSPECTS.add(self.connection.params, c.queue, n, c.unsettled)
        self._gone(reason)

    # -- internals -------------------------------------------------------------------

    def _settle(self, tag: int, multiple: bool, state: Any) -> None:
        if not self.is_open:
            raise pika.exceptions.ChannelWrongStateError("channel is closed")
        tags = [t for t in self.unsettled if t <= tag] if multiple else [tag]
        touched: set[int] = set()
        for t in tags:
            entry = self.unsettled.pop(t, None)
            if entry is None:
                continue  # never ours, or settled: 0-9-1 would close the channel (406)
            dlv, c = entry
            if type(dlv) is fallback.Fetched:
                dlv.held.settle(dlv.tag, state == Delivery.ACCEPTED, state == Delivery.REJECTED)
            elif state == Delivery.MODIFIED:
                dlv.local.failed = True
                dlv.local.undeliverable = False
            if type(dlv) is not fallback.Fetched:
                dlv.update(state)
                dlv.settle()
            c.unsettled -= 1
            touched.add(id(c))
            if c.cancelled and c.unsettled == 0 and c.cancel_ok is None:
                self._retire(c)
        for c in self.consumers.values():
            if id(c) in touched:
                self._grant(c)

    def _grant(self, c: _Consumer) -> None:
        """Credit up to the prefetch, counting what is unsettled and what is granted."""
        link = c.link
        if c.cancelled or c.fetch or not link.state & Link.LOCAL_ACTIVE:
            return
        window = self.prefetch or UNBOUNDED
        want = window - (0 if c.auto_ack else c.unsettled) - link.credit
        if want > 0 and (want * 4 >= window or link.credit == 0):
            link.flow(want)

    def _drained(self, c: _Consumer) -> None:
        cb, c.cancel_ok = c.cancel_ok, None
        if c.unsettled == 0:
            self._retire(c)
        if cb is not None:
            cb(None)

    def _retire(self, c: _Consumer) -> None:
        """A cancelled consumer with nothing unsettled: its link goes."""
        if c.link.state & Link.LOCAL_ACTIVE:
            c.link.close()
        self._forget(c)

    def _forget(self, c: _Consumer) -> None:
        for name, x in list(self.consumers.items()):
            if x is c:
                del self.consumers[name]

    def _outcome(self, dlv: Any) -> None:
        if not dlv.updated:
            return
        sent = self._sent.pop(dlv.tag, None)
        if sent is None:
            return
        seq, exchange, rk, body, props, mandatory = sent
        state = dlv.remote_state
        dlv.settle()
        ok = state == Delivery.ACCEPTED
        if state == Delivery.RELEASED:  # no queue took it
            if mandatory:
                method = pika.spec.Basic.Return(
                    reply_code=312, reply_text="NO_ROUTE", exchange=exchange, routing_key=rk
                )
                for cb in list(self._return_callbacks):
                    cb(self, method, props, body)
            ok = True  # as 0-9-1 confirms an unroutable mandatory publish after its return
        m = pika.spec.Basic.Ack(delivery_tag=seq) if ok else pika.spec.Basic.Nack(delivery_tag=seq)
        if self._on_confirm is not None:
            self._on_confirm(pika.frame.Method(self.channel_number, m))

    def _closed_by(self, code: int, text: str) -> None:
        if self.is_closed:
            return
        self._closing = True
        for c in self.consumers.values():
            if c.link.state & Link.LOCAL_ACTIVE:
                c.link.close()
        if self.session.state & Link.LOCAL_ACTIVE:
            self.session.close()
        self._gone(pika.exceptions.ChannelClosedByBroker(code, text))

    def _gone(self, reason: BaseException) -> None:
        self.is_open = False
        self.is_closed = True
        for dlv, _c in self.unsettled.values():
            if type(dlv) is fallback.Fetched:
                dlv.held.close()  # what it still holds goes back to its queue
        self.unsettled.clear()
        self.consumers.clear()
        self._sent.clear()  # the publisher reports its pending publishes lost
        self.connection.forget(self)
        for cb in list(self._close_callbacks):
            cb(self, reason)


def _salvage(data: bytes, why: str) -> tuple[Any, bytes]:
    """Properties and body for a message proton could not decode (a property or header
    name that is not UTF-8, ...): what ackkit's lenient reader gets of it (its message
    id, content type and application properties, names and text not UTF-8 replaced),
    marked unreadable, and its body (the data sections; else the encoded message whole),
    so its dead letter keeps what can be kept."""
    got = amqp10.read(data)
    if got is None:
        return UnreadableProperties(why), data
    headers = {k: messages.plain(v) for k, v in got.application_properties.items()}
    mid, ct = got.message_id, got.content_type
    props = UnreadableProperties(
        why,
        message_id=None if mid is None else str(mid),
        content_type=None if ct is None else str(ct),
        headers=headers or None,
    )
    return props, data if got.body is None else got.body
