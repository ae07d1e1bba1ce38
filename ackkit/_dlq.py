"""Dead-letter queue tool: inspect what died and why, replay it to where it came from.

The first half is runtime-neutral (what a dead letter says, which copies a
replay takes, the headers of the replayed copy); the second half does the
I/O with pika.

Nothing is lost by construction:

- inspect reads with basic.get and manual acknowledgement, and returns every
  message it read to the queue (basic.nack requeue) before closing;
- replay publishes the copy with publisher confirms and mandatory routing,
  and acks the dead-letter copy only once the broker confirmed the new one.
  An interruption between the two duplicates a message, it never loses one.
  Copies a replay does not take (filtered out, no known origin, publish
  refused) stay unacked until the end and are then returned.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pika
import pika.exceptions

from ._core import headers as H
from ._sync._pika import copy_properties, parameters
from ._url import mask_text

# -- runtime-neutral ---------------------------------------------------------------

_REPLAY_KEEPS = (H.ORIGINAL_EXCHANGE, H.ORIGINAL_ROUTING_KEY)
"""ackkit headers a replayed copy keeps: where the message first came from."""

_BROKER_HEADERS = (
    "x-death",
    "x-first-death-exchange",
    "x-first-death-queue",
    "x-first-death-reason",
    "x-last-death-exchange",
    "x-last-death-queue",
    "x-last-death-reason",
    H.X_DELIVERY_COUNT,
)
"""Headers the broker wrote about the dead copy's past; a replayed copy starts fresh."""


def _text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def _int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    text = _text(value)
    if text is not None and text.strip().isdigit():
        return int(text)
    return None


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """What one message in a dead-letter queue says about its death.

    `source` is "ackkit" (ackkit dead-lettered it and wrote its ackkit-*
    headers), "broker" (the broker dead-lettered it through a queue's DLX:
    a rejection, an expired TTL, a length limit, a quorum delivery limit; read
    from x-death) or "unknown" (published there by something else).
    """

    message_id: str | None
    reason: str
    source: str
    error_type: str | None = None
    error_message: str | None = None
    attempts: int | None = None
    original_queue: str | None = None
    original_exchange: str | None = None
    original_routing_key: str | None = None
    listener: str | None = None
    first_failure: str | None = None
    last_failure: str | None = None
    dead_lettered_at: str | None = None
    replayed: int = 0
    body_size: int = 0
    redelivered: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {f: getattr(self, f) for f in self.__dataclass_fields__}


def describe(
    headers: Mapping[str, Any] | None,
    *,
    message_id: str | None = None,
    body_size: int = 0,
    redelivered: bool = False,
) -> DeadLetter:
    """A DeadLetter from a message's headers (ackkit's own first, then the broker's x-death)."""
    h = headers or {}
    replayed = _int(h.get(H.REPLAYED)) or 0
    common: dict[str, Any] = {
        "message_id": message_id,
        "body_size": body_size,
        "redelivered": redelivered,
        "replayed": replayed,
    }
    if H.REASON in h:
        return DeadLetter(
            reason=_text(h.get(H.REASON)) or "",
            source="ackkit",
            error_type=_text(h.get(H.ERROR_TYPE)),
            error_message=_text(h.get(H.ERROR_MESSAGE)),
            attempts=_int(h.get(H.ATTEMPTS)),
            original_queue=_text(h.get(H.ORIGINAL_QUEUE)),
            original_exchange=_text(h.get(H.ORIGINAL_EXCHANGE)),
            original_routing_key=_text(h.get(H.ORIGINAL_ROUTING_KEY)),
            listener=_text(h.get(H.LISTENER)),
            first_failure=_text(h.get(H.FIRST_FAILURE)),
            last_failure=_text(h.get(H.LAST_FAILURE)),
            dead_lettered_at=_text(h.get(H.DEAD_LETTERED_AT)),
            **common,
        )
    deaths = h.get("x-death")
    if isinstance(deaths, list) and deaths and isinstance(deaths[0], Mapping):
        last = deaths[0]  # the broker keeps the most recent death first
        keys = last.get("routing-keys") or []
        when = last.get("time")
        return DeadLetter(
            reason=_text(last.get("reason")) or "dead-lettered by the broker",
            source="broker",
            attempts=_int(h.get(H.ATTEMPT)) or None,
            original_queue=_text(last.get("queue")),
            original_exchange=_text(last.get("exchange")),
            original_routing_key=_text(keys[0]) if keys else None,
            dead_lettered_at=when.isoformat() if isinstance(when, _dt.datetime) else _text(when),
            **common,
        )
    return DeadLetter(reason="unknown (no ackkit or x-death headers)", source="unknown", **common)


@dataclass(frozen=True, slots=True)
class ReplayFilter:
    """Which dead letters a replay takes; every given criterion must match."""

    error_type: str | None = None
    """Matches the error type's qualified name or its last part ('ValueError')."""
    reason_contains: str | None = None
    """Case-insensitive substring of the reason."""
    message_ids: frozenset[str] = frozenset()

    def matches(self, dl: DeadLetter) -> bool:
        if self.error_type is not None:
            et = dl.error_type or ""
            if et != self.error_type and et.rsplit(".", 1)[-1] != self.error_type:
                return False
        if self.reason_contains is not None and (
            self.reason_contains.lower() not in dl.reason.lower()
        ):
            return False
        return not (self.message_ids and dl.message_id not in self.message_ids)


def replay_target(dl: DeadLetter, to: str | None = None) -> str | None:
    """The queue a replayed copy goes to: `to`, else the queue it was dead-lettered from."""
    return to or dl.original_queue


def replay_headers(headers: Mapping[str, Any] | None, now: str) -> dict[str, Any]:
    """Headers of the replayed copy: the user's own, where it first came from, and
    ackkit-replayed (how often it was replayed); attempt count and error reset."""
    out: dict[str, Any] = {}
    for k, v in (headers or {}).items():
        if k in _BROKER_HEADERS:
            continue
        if k.startswith(H.PREFIX) and k not in _REPLAY_KEEPS:
            continue
        out[k] = v
    out[H.REPLAYED] = (_int((headers or {}).get(H.REPLAYED)) or 0) + 1
    out[H.REPLAYED_AT] = now
    return out


@dataclass
class ReplayReport:
    """What a replay did. Running it again is safe: replayed copies left the DLQ."""

    queue: str
    examined: int = 0
    replayed: int = 0
    skipped: int = 0
    """Did not match the filter: left in the DLQ."""
    no_target: int = 0
    """No --to and no known origin queue: left in the DLQ."""
    failed: int = 0
    """The broker refused or could not route the copy: left in the DLQ."""
    targets: dict[str, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    remaining: int | None = None
    """Messages in the DLQ after the replay (passive declare)."""

    @property
    def left(self) -> int:
        return self.skipped + self.no_target + self.failed

    def to_dict(self) -> dict[str, Any]:
        return {
            "queue": self.queue,
            "examined": self.examined,
            "replayed": self.replayed,
            "skipped": self.skipped,
            "no_target": self.no_target,
            "failed": self.failed,
            "targets": dict(self.targets),
            "errors": list(self.errors),
            "remaining": self.remaining,
        }


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="milliseconds")


# -- pika I/O ------------------------------------------------------------------------


class DeadLetterQueue:
    """One dead-letter queue on a broker: count, inspect, replay.

    ```
    with DeadLetterQueue(url, "orders.dlq") as dlq:
        for dl in dlq.inspect(limit=20): print(dl.reason)
        report = dlq.replay(select=ReplayFilter(error_type="TimeoutError"))
    ```
    """

    def __init__(self, url: str, queue: str, *, connection_name: str = "ackkit-dlq") -> None:
        self.url = url
        self.queue = queue
        self._conn: Any = pika.BlockingConnection(parameters(url, name=connection_name))

    def __enter__(self) -> DeadLetterQueue:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._conn is not None and self._conn.is_open:
            with contextlib.suppress(pika.exceptions.AMQPError):
                self._conn.close()
        self._conn = None

    def count(self) -> int:
        """Messages ready in the queue (passive declare: raises if it does not exist)."""
        ch = self._conn.channel()
        try:
            ok = ch.queue_declare(self.queue, passive=True)
            return int(ok.method.message_count)
        finally:
            if ch.is_open:
                ch.close()

    def inspect(self, limit: int | None = None) -> list[DeadLetter]:
        """Up to `limit` dead letters from the head of the queue, all left in place."""
        return [dl for dl, _props, _body in self.peek(limit)]

    def peek(self, limit: int | None = None) -> list[tuple[DeadLetter, Any, bytes]]:
        """Like inspect(), with each message's properties and body."""
        total = self.count()
        n = total if limit is None else min(limit, total)
        out: list[tuple[DeadLetter, Any, bytes]] = []
        ch = self._conn.channel()
        try:
            for _ in range(n):
                method, props, body = ch.basic_get(self.queue, auto_ack=False)
                if method is None:
                    break
                dl = describe(
                    props.headers,
                    message_id=props.message_id,
                    body_size=len(body),
                    redelivered=method.redelivered,
                )
                out.append((dl, props, body))
            if out:
                ch.basic_nack(0, multiple=True, requeue=True)
        finally:
            if ch.is_open:
                ch.close()  # also requeues anything still unacked
        return out

    def replay(
        self,
        *,
        to: str | None = None,
        select: ReplayFilter | None = None,
        limit: int | None = None,
        on_replayed: Callable[[DeadLetter, str], None] | None = None,
    ) -> ReplayReport:
        """Publish matching dead letters to `to` or their origin queue, then ack them.

        Looks at most at the messages the queue holds when the replay starts
        (a copy replayed into the DLQ itself is not taken twice); `limit`
        bounds how many are replayed.
        """
        flt = select or ReplayFilter()
        report = ReplayReport(self.queue)
        budget = self.count()
        ch = self._conn.channel()
        ch.confirm_delivery()
        held = 0
        try:
            while report.examined < budget and (limit is None or report.replayed < limit):
                method, props, body = ch.basic_get(self.queue, auto_ack=False)
                if method is None:
                    break
                report.examined += 1
                dl = describe(
                    props.headers,
                    message_id=props.message_id,
                    body_size=len(body),
                    redelivered=method.redelivered,
                )
                if not flt.matches(dl):
                    report.skipped += 1
                    held += 1
                    continue
                target = replay_target(dl, to)
                if target is None:
                    report.no_target += 1
                    held += 1
                    continue
                props.headers = replay_headers(props.headers, _now())
                props.wire_headers = None  # the replay's headers, not the bytes received
                copy = copy_properties(props, {}, purpose="restamp")
                try:
                    ch.basic_publish("", target, body, copy, mandatory=True)
                except (pika.exceptions.UnroutableError, pika.exceptions.NackError) as exc:
                    report.failed += 1
                    held += 1
                    report.errors.append(
                        f"{dl.message_id or '?'} -> {target}: {type(exc).__name__}"
                        + (" (no such queue?)" if "Unroutable" in type(exc).__name__ else "")
                    )
                    continue
                # Confirmed: only now the dead-letter copy may go.
                ch.basic_ack(method.delivery_tag)
                report.replayed += 1
                report.targets[target] = report.targets.get(target, 0) + 1
                if on_replayed is not None:
                    on_replayed(dl, target)
            if held:
                ch.basic_nack(0, multiple=True, requeue=True)
        finally:
            if ch.is_open:
                ch.close()
        report.remaining = self.count()
        return report


def inspect_dead_letters(url: str, queue: str, limit: int | None = None) -> list[DeadLetter]:
    """The dead letters at the head of `queue` (nothing is removed)."""
    with DeadLetterQueue(url, queue) as dlq:
        return dlq.inspect(limit)


def replay_dead_letters(
    url: str,
    queue: str,
    *,
    to: str | None = None,
    error_type: str | None = None,
    reason_contains: str | None = None,
    message_ids: Iterable[str] = (),
    limit: int | None = None,
) -> ReplayReport:
    """Replay dead letters of `queue` to `to` or to the queue each one died in."""
    flt = ReplayFilter(error_type, reason_contains, frozenset(message_ids))
    with DeadLetterQueue(url, queue) as dlq:
        return dlq.replay(to=to, select=flt, limit=limit)


def safe_error(exc: BaseException, url: str) -> str:
    """An error message for humans, with the URL's password masked."""
    from urllib.parse import unquote, urlsplit

    pw = urlsplit(url).password
    return mask_text(f"{type(exc).__name__}: {exc}", *([unquote(pw), pw] if pw else []))
