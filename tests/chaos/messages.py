"""What the chaos producer publishes: a deterministic mix of good, poison, slow and bad messages.

Every message has a unique message_id of the form ``<q>-<n>-<kind>`` (q is ``c`` for
the classic queue, ``q`` for the quorum queue), so the analysis knows what each
record and each dead letter is without a side table.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from typing import Any

MAX_BODY = 16 * 1024
"""The consumers' max_body_size; oversized bodies exceed it."""

# kind -> substring the ackkit-reason header of its dead letter must contain
EXPECTED_REASON = {
    "poison": "attempts exhausted",
    "slow": "attempts exhausted",
    "invalid_json": "bad payload: ",
    "wrong_schema": "bad payload: does not match",
    "invalid_utf8": "bad payload: ",
    "empty": "bad payload: empty body",
    "oversized": "exceeds max_body_size",
    "bad_header": "invalid ackkit-attempt header",
    "content_type": "is not JSON",
    # A hostile producer (another team, another language): poison messages whose
    # headers try to break the counting or the copies, and messages the client
    # library cannot decode at all.
    "forged_count": "attempts exhausted",
    "bad_xdeath": "attempts exhausted",
    "huge_headers": "attempts exhausted",
    "unreadable": "unreadable message",
}
OVER_AMQP10: dict[str, str | tuple[str, ...]] = {
    **EXPECTED_REASON,
    # RabbitMQ converts the headers for an AMQP 1.0 consumer: a timestamp past year 9999
    # arrives as a (wrapped) timestamp, so the poison body runs its attempts; a name that
    # is not UTF-8 still cannot be read, and proton's decode fails: "unreadable message"
    "unreadable": ("unreadable message", "attempts exhausted"),
}
"""The reasons when every consumer is the App over AMQP 1.0 (`Settings.runtimes`)."""
BAD_KINDS = (
    "invalid_json",
    "wrong_schema",
    "invalid_utf8",
    "empty",
    "oversized",
    "bad_header",
    "content_type",
)
HOSTILE_KINDS = ("forged_count", "bad_xdeath", "huge_headers", "unreadable")
HANDLED_KINDS = ("good", "poison", "slow")
"""Kinds whose body decodes, so the handler runs (and records) for them."""

GARBAGE_ATTEMPTS: tuple[Any, ...] = ("abc", -1, 10**12, 0, "2.5", " ", True)


@dataclass(frozen=True)
class Message:
    message_id: str
    queue: str
    kind: str
    body: bytes
    headers: dict[str, Any] = field(default_factory=dict)
    content_type: str = "application/json"
    raw_headers: bytes | None = None
    """An encoded header table no client library would build (published raw)."""


def kind_of(message_id: str) -> str:
    return message_id.rsplit("-", 1)[1]


def plan(
    total: int,
    queues: tuple[str, str],
    *,
    poison: float = 0.10,
    bad: float = 0.035,
    hostile: float = 0.02,
    slow: int = 2,
    seed: int = 7,
) -> list[Message]:
    """`total` messages over the two queues (alternating), in a shuffled order of kinds."""
    rnd = random.Random(seed)
    n_poison = round(total * poison)
    n_bad = round(total * bad)
    n_hostile = round(total * hostile)
    kinds = ["poison"] * n_poison + ["slow"] * slow
    kinds += [BAD_KINDS[i % len(BAD_KINDS)] for i in range(n_bad)]
    kinds += [HOSTILE_KINDS[i % len(HOSTILE_KINDS)] for i in range(n_hostile)]
    kinds += ["good"] * (total - len(kinds))
    rnd.shuffle(kinds)
    out = []
    for n, kind in enumerate(kinds):
        queue = queues[n % 2]
        mid = f"{'c' if n % 2 == 0 else 'q'}-{n:06d}-{kind}"
        out.append(_message(rnd, mid, queue, kind, n))
    return out


def _message(rnd: random.Random, mid: str, queue: str, kind: str, n: int) -> Message:
    pad = "x" * rnd.randint(0, 200)
    good = {"id": n, "kind": "good", "pad": pad}
    if kind in HANDLED_KINDS:
        return Message(mid, queue, kind, json.dumps({**good, "kind": kind}).encode())
    if kind == "invalid_json":
        return Message(mid, queue, kind, json.dumps(good).encode()[:-3])
    if kind == "wrong_schema":
        return Message(mid, queue, kind, json.dumps({"id": "n/a", "kind": 42}).encode())
    if kind == "invalid_utf8":
        return Message(mid, queue, kind, b'{"id": %d, "kind": "go\xff\xfeod"}' % n)
    if kind == "empty":
        return Message(mid, queue, kind, b"")
    if kind == "oversized":
        body = json.dumps({**good, "pad": "y" * (MAX_BODY + 1024)}).encode()
        return Message(mid, queue, kind, body)
    if kind == "bad_header":
        attempt = GARBAGE_ATTEMPTS[n % len(GARBAGE_ATTEMPTS)]
        return Message(mid, queue, kind, json.dumps(good).encode(), {"ackkit-attempt": attempt})
    if kind == "content_type":
        return Message(mid, queue, kind, json.dumps(good).encode(), content_type="text/plain")
    return _hostile(mid, queue, kind, n, json.dumps({**good, "kind": "poison"}).encode())


BAD_XDEATH: tuple[Any, ...] = (
    "not a list",
    [{"count": "many", "reason": 7, "queue": ["q"], "time": "yesterday"}],
    [1, 2, 3],
    [{"count": -1, "routing-keys": "x"}],
)


def _hostile(mid: str, queue: str, kind: str, n: int, poison: bytes) -> Message:
    """Messages of a producer that writes what it likes into the headers."""
    if kind == "forged_count":
        # Classic queues pass a publisher's x-delivery-count through: it must not stop
        # ackkit from counting redeliveries.
        return Message(mid, queue, kind, poison, {"x-delivery-count": n % 3})
    if kind == "bad_xdeath":
        return Message(mid, queue, kind, poison, {"x-death": BAD_XDEATH[n % len(BAD_XDEATH)]})
    if kind == "huge_headers":
        # Close to frame_max (131,072) already: ackkit's retry / dead-letter headers
        # must still fit in the copy's content header.
        return Message(mid, queue, kind, poison, {"pad": "h" * 126_000})
    if kind == "unreadable":
        from tests.adversarial.rawamqp import Field, encode_table

        bad = (
            encode_table({b"caf\xe9": 1})  # a header name that is not UTF-8
            if n % 2
            else encode_table({"at": Field("T", 2**62)})  # a timestamp past year 9999
        )
        return Message(mid, queue, kind, poison, raw_headers=bad)
    raise ValueError(kind)
