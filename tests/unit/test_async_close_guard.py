"""CloseGuard: no frame reaches the broker on a channel number after its close.

A basic.publish queued behind aiormq's channel.close-ok made RabbitMQ close the whole
connection (504 "expected 'channel.open'") in the 403 case of the adversarial run
(tests/adversarial/RESULTS.md, note A)."""

from __future__ import annotations

from typing import Any

import pamqp.frame
from pamqp import commands as spec
from pamqp.body import ContentBody
from pamqp.header import ContentHeader

from ackkit._async._closing import CloseGuard


class Sink:
    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.transport = "the transport"

    def write(self, data: bytes) -> None:
        self.written.append(data)


def frames(channel: int, *parts: Any) -> bytes:
    return b"".join(pamqp.frame.marshal(p, channel) for p in parts)


def publish(channel: int) -> bytes:
    return frames(
        channel,
        spec.Basic.Publish(exchange="", routing_key="q.dlq"),
        ContentHeader(body_size=2),
        ContentBody(b"{}"),
    )


def test_a_publish_after_a_close_ok_is_dropped_until_the_number_is_opened_again() -> None:
    sink = Sink()
    guard = CloseGuard(sink)  # type: ignore[arg-type]
    sent = [
        publish(7),
        frames(7, spec.Channel.CloseOk()),  # the answer to the broker's 403 close
        publish(7),  # queued behind it: the broker would close the connection (504)
        frames(7, spec.Basic.Ack(delivery_tag=1)),
        publish(6),  # another channel is not touched
        frames(0, spec.Connection.Close(reply_code=200, class_id=0, method_id=0)),
        frames(7, spec.Channel.Open()),  # a new channel with the number
        publish(7),
    ]
    for data in sent:
        guard.write(data)
    assert sink.written == [sent[0], sent[1], sent[4], sent[5], sent[6], sent[7]]


def test_after_our_close_only_the_answer_to_a_crossing_close_goes_out() -> None:
    sink = Sink()
    guard = CloseGuard(sink)  # type: ignore[arg-type]
    sent = [
        frames(3, spec.Channel.Close(reply_code=200, class_id=0, method_id=0)),
        publish(3),
        frames(3, spec.Channel.CloseOk()),
        b"AMQP\x00\x00\x09\x01",  # not a frame: passes as it is
    ]
    for data in sent:
        guard.write(data)
    assert sink.written == [sent[0], sent[2], sent[3]]
    assert guard.transport == "the transport"  # the rest is the writer's
