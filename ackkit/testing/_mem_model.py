"""The in-memory broker's state and rules: queues, exchanges, channels, deliveries.

What RabbitMQ does with a message, modelled closely enough for ackkit's core to
be run against it: routing through the default, direct, fanout and topic
exchanges; consumers served round-robin within their prefetch; delivery tags
per channel; ack / nack / reject (single and `multiple`), a requeued message
going back to its place with `redelivered` set; every unsettled delivery of a
closed channel requeued; an unknown delivery tag or a missing queue closing the
channel (406 / 404) as the broker does; queue arguments checked on re-declare
(406); dead-lettering through `x-dead-letter-exchange` with `x-death`;
`x-message-ttl` and per-message `expiration` (expired at the head of the
queue); quorum queues' `x-delivery-count`, `x-acquired-count` and delivery limit;
`x-max-length` (drop-head or reject-publish); publisher confirms and `mandatory`
returns; transactions (`tx.select` / `tx.commit`). What differs between RabbitMQ
versions is decided by `self.rules` (`_mem_rules`), nowhere else.

Nothing here knows a client library: the facades (`_mem_pika`, `_mem_aio`) turn
`ChannelError` into their library's exceptions and `Sink` calls into their
library's callbacks. One lock guards the whole state; sinks are called under
it and must only hand work to their own loop.
"""

from __future__ import annotations

import bisect

from .._core import wire
from ._mem_deaths import Deaths
from ._mem_state import (
    ACCESS_REFUSED,
    PRECONDITION_FAILED,
    Channel,
    ChannelError,
    Consumer,
    Message,
    Queue,
    Sink,
    Unacked,
    broker_written,
    copy_message,
    expiration,
    python_headers,
)

USER = "guest"
"""The user every connection to an in-memory broker is authenticated as."""


class Model(Deaths):
    """The state of one in-memory broker: its topology, channels and deliveries."""

    def publish(self, msg: Message, *, mandatory: bool = False) -> tuple[bool, bool]:
        """Route `msg`; returns (returned, refused): returned when `mandatory` and no queue
        took it (basic.return), refused when a queue with x-overflow=reject-publish is full
        (the confirm is a nack). A user_id other than the connection's user ("guest")
        is refused as RabbitMQ refuses it (406, the channel closes)."""
        user_id = msg.properties().get("user_id")
        if user_id is not None and user_id != USER:
            raise ChannelError(
                PRECONDITION_FAILED,
                f"PRECONDITION_FAILED - user_id property set to '{user_id}' but "
                f"authenticated user was '{USER}'",
            )
        with self.lock:
            headers = python_headers(msg)
            if msg.deaths is None and not self.rules.honours_client_x_death:
                msg.deaths = []  # 4.0+: the publisher's x-death is not the broker's
            queues = self.route(msg.exchange, msg.routing_key, headers)
            refused = False
            for q in queues:
                refused |= not self._enqueue(q, copy_message(msg))
            return (mandatory and not queues), refused

    def _enqueue(self, q: Queue, msg: Message) -> bool:
        """Into `q` (False: a full reject-publish queue refused it). Delivered at once
        when a consumer can take it, even with a TTL of 0 (which expires it at once
        otherwise); a drop-head queue then drops from the head down to its limits."""
        self._expire(q)
        if self._refuses(q, msg):
            return False
        msg.seq = next(self._seq)
        now = self.clock.now()
        ttls = [t for t in (q.arg("x-message-ttl"), expiration(msg)) if t is not None]
        msg.expires_at = now + min(ttls) / 1000.0 * self.clock.scale if ttls else None
        if ttls and min(ttls) == 0 and not q.ready and self._next_consumer(q) is not None:
            msg.expires_at = None  # a consumer takes it now: RabbitMQ delivers it
        q.ready.append((msg.seq, msg))
        self._dispatch(q)
        self._drop_head(q)
        self._over_limit(q)
        return True

    # -- channels and consumers -------------------------------------------------------

    def open_channel(self, sink: Sink, connection_name: str) -> Channel:
        with self.lock:
            ch = Channel(len(self.channels) + 1, sink, connection_name)
            self.channels.add(id(ch))
            return ch

    def close_channel(self, ch: Channel, code: int = 200, text: str = "OK") -> None:
        """The channel is gone: its consumers end, its unsettled deliveries are requeued."""
        with self.lock:
            if not ch.open:
                return
            ch.open = False
            self.channels.discard(id(ch))
            for c in ch.consumers.values():
                if c in c.queue.consumers:
                    c.queue.consumers.remove(c)
            ch.consumers.clear()
            touched = []
            for tag in sorted(ch.unacked):
                u = self._pop(ch, tag)
                self._requeue(u, counts=True)  # a lost consumer counts on every version
                touched.append(u.queue)
            for q in {id(q): q for q in touched}.values():
                self._drop_head(q)  # requeued over its limit: as RabbitMQ, before delivering
                self._dispatch(q)
            ch.sink.closed(code, text)
            self.changed.notify_all()

    def fail_channel(self, ch: Channel, code: int, text: str) -> ChannelError:
        self.close_channel(ch, code, text)
        return ChannelError(code, text)

    def qos(self, ch: Channel, prefetch: int, global_qos: bool = False) -> bool:
        with self.lock:
            self.rules.check_qos(global_qos)
            ch.prefetch = prefetch
            return True

    def consume(
        self,
        ch: Channel,
        queue: str,
        no_ack: bool,
        tag: str | None = None,
        exclusive: bool = False,
    ) -> str:
        """basic.consume; refused (403, the channel closes) while the queue has an
        exclusive consumer, and an exclusive one while it has any consumer."""
        with self.lock:
            try:
                q = self._queue(queue)
            except ChannelError as exc:
                raise self.fail_channel(ch, exc.code, exc.text) from None
            if q.consumers and (exclusive or any(c.exclusive for c in q.consumers)):
                raise self.fail_channel(
                    ch,
                    ACCESS_REFUSED,
                    f"ACCESS_REFUSED - queue '{q.name}' in vhost '/' in exclusive use",
                )
            tag = tag or f"amq.ctag-{next(self._ctag)}"
            c = Consumer(tag, q, ch, no_ack, exclusive=exclusive)
            ch.consumers[tag] = c
            q.consumers.append(c)
            self._dispatch(q)
            self.changed.notify_all()
            return tag

    def cancel(self, ch: Channel, tag: str) -> None:
        with self.lock:
            c = ch.consumers.pop(tag, None)
            if c is not None and c in c.queue.consumers:
                c.queue.consumers.remove(c)
            self.changed.notify_all()

    def get(self, ch: Channel, queue: str, no_ack: bool) -> tuple[int, Message, int] | None:
        """basic.get: (delivery tag, message, messages left) or None when empty."""
        with self.lock:
            try:
                q = self._queue(queue)
            except ChannelError as exc:
                raise self.fail_channel(ch, exc.code, exc.text) from None
            self._expire(q)
            if not q.ready:
                return None
            msg = self._take(q)
            if msg is None:
                return None
            tag = ch.next_tag
            ch.next_tag += 1
            if not no_ack:
                ch.unacked[tag] = Unacked(q, msg, None)
                q.unacked += 1
            self.changed.notify_all()
            return tag, msg, len(q.ready)

    def _take(self, q: Queue) -> Message | None:
        """The head of `q`, or None. A quorum queue writes its counts into the headers
        (x-delivery-count, on 4.3 x-acquired-count too) and dead-letters a message whose
        counted returns passed its delivery limit instead."""
        while q.ready:
            _, msg = q.ready.pop(0)
            if not q.quorum:
                return msg
            self._relax(q)
            limit = self.rules.delivery_limit(q.arg("x-delivery-limit"))
            if limit is not None and msg.counted > limit:
                self._dead_letter(q, msg, "delivery_limit")
                continue
            self._stamp_counts(msg)
            return msg
        return None

    def _stamp_counts(self, msg: Message) -> None:
        """The count headers a quorum queue writes on a delivery of `msg`."""
        props = msg.properties()
        headers = dict(props.get("headers") or {})
        before = dict(headers)
        if msg.counted or (
            "x-delivery-count" in headers and self.rules.overwrite_first_delivery_count
        ):
            headers["x-delivery-count"] = msg.counted
        if self.rules.acquired_count and msg.returns:
            headers["x-acquired-count"] = msg.returns
        if headers != before:
            props["headers"] = broker_written(headers)
            msg.props = wire.encode_properties(props)

    def _next_consumer(self, q: Queue) -> int | None:
        """The index (round-robin) of the next consumer of `q` with room, or None."""
        n = len(q.consumers)
        for i in range(n):
            c = q.consumers[(q.turn + i) % n]
            if c.no_ack or not c.channel.prefetch or c.unacked < c.channel.prefetch:
                return (q.turn + i) % n
        return None

    def _dispatch(self, q: Queue) -> None:
        self._expire(q)
        while q.ready and q.consumers and q.name in self.queues:
            i = self._next_consumer(q)
            if i is None:
                return
            c = q.consumers[i]
            ch = c.channel
            q.turn = (i + 1) % len(q.consumers)
            msg = self._take(q)
            if msg is None:
                return
            tag = ch.next_tag
            ch.next_tag += 1
            if not c.no_ack:
                ch.unacked[tag] = Unacked(q, msg, c)
                c.unacked += 1
                q.unacked += 1
            ch.sink.deliver(c.tag, tag, msg, msg.redelivered)
        self.changed.notify_all()

    # -- settling -----------------------------------------------------------------

    def settle(self, ch: Channel, kind: str, tag: int, multiple: bool, requeue: bool) -> None:
        """basic.ack / nack / reject; an unknown tag closes the channel (406)."""
        with self.lock:
            if ch.tx:
                self._check_tags(ch, tag, multiple)
                ch.tx_ops.append(lambda: self._settle(ch, kind, tag, multiple, requeue))
                return
            self._settle(ch, kind, tag, multiple, requeue)

    def _check_tags(self, ch: Channel, tag: int, multiple: bool) -> None:
        if tag not in ch.unacked and not (multiple and tag == 0):
            raise self.fail_channel(
                ch, PRECONDITION_FAILED, f"PRECONDITION_FAILED - unknown delivery tag {tag}"
            )

    def _settle(self, ch: Channel, kind: str, tag: int, multiple: bool, requeue: bool) -> None:
        if not ch.open:
            return
        self._check_tags(ch, tag, multiple)
        tags = [t for t in sorted(ch.unacked) if t <= tag or tag == 0] if multiple else [tag]
        touched: dict[int, Queue] = {}
        for t in tags:
            u = self._pop(ch, t)
            touched[id(u.queue)] = u.queue
            if kind == "ack":
                continue
            if requeue:
                self._requeue(u, counts=kind == "reject" or self.rules.nack_counts)
            else:
                self._dead_letter(u.queue, u.msg, "rejected")
        for q in touched.values():
            self._drop_head(q)  # requeued over its limit: as RabbitMQ, before delivering
            self._dispatch(q)
        self.changed.notify_all()

    def _pop(self, ch: Channel, tag: int) -> Unacked:
        u = ch.unacked.pop(tag)
        u.queue.unacked -= 1
        if u.consumer is not None:
            u.consumer.unacked -= 1
        return u

    def _requeue(self, u: Unacked, *, counts: bool) -> None:
        """Back to its place; `counts`: the return counts in x-delivery-count (and
        toward the delivery limit), which `self.rules` decides per settle kind."""
        q = u.queue
        msg = u.msg
        msg.redelivered = True
        msg.returns += 1
        msg.counted += counts
        if q.name in self.queues:
            bisect.insort(q.ready, (msg.seq, msg), key=lambda e: e[0])

    # -- transactions -------------------------------------------------------------------

    def tx_select(self, ch: Channel) -> None:
        with self.lock:
            ch.tx = True

    def tx_commit(self, ch: Channel) -> None:
        with self.lock:
            ops, ch.tx_ops = ch.tx_ops, []
            for op in ops:
                op()

    def tx_rollback(self, ch: Channel) -> None:
        with self.lock:
            ch.tx_ops.clear()

    # -- reading --------------------------------------------------------------------

    def counts(self, name: str) -> tuple[int, int, int, int] | None:
        with self.lock:
            q = self.queues.get(name)
            if q is None:
                return None
            self._expire(q)
            return len(q.ready), q.unacked, len(q.ready) + q.unacked, len(q.consumers)
