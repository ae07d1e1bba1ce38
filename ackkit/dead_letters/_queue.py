"""Dead-letter queue tool: inspect what died and why, replay it to where it came from.

What a dead letter says and which copies a replay takes is read in
`_letter.py`; this module does the I/O with pika.

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
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import pika
import pika.exceptions

from .._connection import addresses
from .._connection.io import connect_in_turn
from .._connection.url import check_url, mask_text
from .._core import checks as C
from .._core import wire
from .._sync import _frames as frames
from .._sync._pika import blocking_connection, copy_properties, parameters
from ._letter import (
    DeadLetter,
    ReplayFilter,
    ReplayReport,
    describe,
    replay_headers,
    replay_target,
)


def _now() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="milliseconds")


# -- pika I/O ------------------------------------------------------------------------

_REFUSED = (
    pika.exceptions.ProbableAuthenticationError,
    pika.exceptions.ProbableAccessDeniedError,
)
"""Connect errors no other node address would fix (same user, same virtual host)."""


class DeadLetterQueue:
    """One dead-letter queue on a broker: count, inspect, replay.

    ```
    with DeadLetterQueue(url, "orders.dlq") as dlq:
        for dl in dlq.inspect(limit=20): print(dl.reason)
        report = dlq.replay(select=ReplayFilter(error_type="TimeoutError"))
    ```
    """

    def __init__(
        self, url: str | Sequence[str], queue: str, *, connection_name: str = "ackkit-dlq"
    ) -> None:
        self.urls = addresses.parse(url)
        """Every node's URL (one URL, the comma form or a list), in the order tried."""
        self.queue = C.queue_name("queue", queue, declared=False)
        rotation = addresses.Rotation(self.urls)
        # reads what pika cannot decode as salvaged properties (see _sync/_frames.py)
        self._conn: Any = connect_in_turn(
            rotation,
            lambda u: blocking_connection(parameters(check_url(u), name=connection_name)),
            final=_REFUSED,
            what=connection_name,
        )
        self.url = rotation.current
        """The node address the connection is to."""

    def __enter__(self) -> DeadLetterQueue:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection (the `with` block does this)."""
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
        _limit(limit)
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
                    readable_headers(props),
                    message_id=props.message_id,
                    body_size=len(body),
                    redelivered=method.redelivered,
                    unreadable=frames.unreadable(method, props),
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
        _limit(limit)
        if to is not None:
            C.queue_name("to", to, declared=False)
        if select is not None and not isinstance(select, ReplayFilter):
            raise TypeError(f"select must be a ReplayFilter or None, got {select!r}")
        flt = select or ReplayFilter()
        report = ReplayReport(self.queue)
        budget = self.count()
        ch = self._replay_channel()
        held = 0
        try:
            while report.examined < budget and (limit is None or report.replayed < limit):
                if not ch.is_open:
                    # The broker requeued every copy held on it: they are examined again.
                    ch, held = self._replay_channel(), 0
                method, props, body = ch.basic_get(self.queue, auto_ack=False)
                if method is None:
                    break
                report.examined += 1
                outcome, dl, target, why = self._replay_one(ch, method, props, body, flt, to)
                if outcome == "replayed":
                    assert target is not None
                    report.replayed += 1
                    report.targets[target] = report.targets.get(target, 0) + 1
                    if on_replayed is not None:
                        on_replayed(dl, target)  # may raise to stop the replay: nothing is lost
                    continue
                held += 1
                if outcome == "skipped":
                    report.skipped += 1
                elif outcome == "no_target":
                    report.no_target += 1
                    if dl.notes:
                        report.errors.append(
                            f"{dl.message_id or '?'}: no origin queue ({'; '.join(dl.notes)})"
                        )
                else:
                    report.failed += 1
                    report.errors.append(f"{dl.message_id or '?'} -> {target}: {why}")
            if held and ch.is_open:
                ch.basic_nack(0, multiple=True, requeue=True)
        finally:
            if ch.is_open:
                with contextlib.suppress(pika.exceptions.AMQPError):
                    ch.close()  # also requeues anything still unacked
        report.remaining = self._settled_count(report.left)
        return report

    def _settled_count(self, left: int) -> int:
        """The queue's count once the `left` dead letters this replay gave back are in it
        again: the broker may answer a count before it has finished requeueing them (seen
        on 4.3). Waits at most 2 s (another consumer may have taken some meanwhile)."""
        deadline = time.monotonic() + 2.0
        n = self.count()
        while n < left and time.monotonic() < deadline:
            time.sleep(0.05)
            n = self.count()
        return n

    def _replay_channel(self) -> Any:
        ch = self._conn.channel()
        ch.confirm_delivery()
        return ch

    def _replay_one(
        self, ch: Any, method: Any, props: Any, body: bytes, flt: ReplayFilter, to: str | None
    ) -> tuple[str, DeadLetter, str | None, str]:
        """Replay one dead letter: (outcome, what it says, target, why it failed).

        Outcomes: replayed (confirmed, then acked), skipped, no_target, failed.
        Anything but "replayed" leaves the copy unacked (it stays in the DLQ);
        nothing one message carries stops the replay of the others.
        """
        dl = describe(
            readable_headers(props),
            message_id=getattr(props, "message_id", None),
            body_size=len(body),
            redelivered=method.redelivered,
            unreadable=frames.unreadable(method, props),
        )
        if not flt.matches(dl):
            return "skipped", dl, None, ""
        target = replay_target(dl, to)
        if target is None:
            return "no_target", dl, None, ""
        try:
            props.headers = replay_headers(props.headers, _now())
            props.wire_headers = None  # the replay's headers, not the bytes received
            copy = copy_properties(props, {}, purpose="restamp")
            ch.basic_publish("", target, body, copy, mandatory=True)
        except pika.exceptions.UnroutableError:
            return "failed", dl, target, "UnroutableError (no such queue?)"
        except pika.exceptions.NackError:
            return "failed", dl, target, "NackError (the broker refused the copy)"
        except (pika.exceptions.AMQPConnectionError, pika.exceptions.StreamLostError):
            raise  # the connection is gone: nothing more can be replayed
        except Exception as exc:
            # Headers pika cannot encode again, a channel the broker closed, ...
            return "failed", dl, target, mask_text(f"{type(exc).__name__}: {exc}")[:300]
        # Confirmed: only now the dead-letter copy may go.
        ch.basic_ack(method.delivery_tag)
        return "replayed", dl, target, ""


def readable_headers(props: Any) -> Any:
    """The headers to describe a dead letter by: pika's, or when pika could not read the
    table (a timestamp past year 9999 or a name that is not UTF-8 somewhere in x-death),
    every entry that can be read of its bytes, so a valid origin queue next to the
    garbage is still found. Only read: the replayed copy never carries them."""
    headers = getattr(props, "headers", None)
    raw = getattr(props, "ackkit_raw_headers", None)
    if headers is None and raw is not None:
        return wire.lenient_table(raw)
    return headers


def _limit(limit: object) -> None:
    if limit is not None:
        C.integer("limit", limit, 0)


def inspect_dead_letters(
    url: str | Sequence[str], queue: str, limit: int | None = None
) -> list[DeadLetter]:
    """The dead letters at the head of `queue` (nothing is removed)."""
    with DeadLetterQueue(url, queue) as dlq:
        return dlq.inspect(limit)


def replay_dead_letters(
    url: str | Sequence[str],
    queue: str,
    *,
    to: str | None = None,
    error_type: str | None = None,
    reason_contains: str | None = None,
    message_ids: Iterable[str] = (),
    limit: int | None = None,
) -> ReplayReport:
    """Replay dead letters of `queue` to `to` or to the queue each one died in."""
    if isinstance(message_ids, (str, bytes)):
        raise TypeError(
            f"message_ids must be a list of ids, got the string {message_ids!r} (which would "
            "be taken as its characters)"
        )
    for opt, v in (("error_type", error_type), ("reason_contains", reason_contains)):
        if v is not None:
            C.text(opt, v)
    flt = ReplayFilter(error_type, reason_contains, frozenset(message_ids))
    with DeadLetterQueue(url, queue) as dlq:
        return dlq.replay(to=to, select=flt, limit=limit)


def safe_error(exc: BaseException, url: str | Sequence[str]) -> str:
    """An error message for humans, with the passwords of `url` (one URL, the comma
    form or several) masked."""
    from urllib.parse import unquote, urlsplit

    secrets = []
    for u in [url] if isinstance(url, str) else url:
        pw = urlsplit(u).password
        secrets += [unquote(pw), pw] if pw else []
    return mask_text(f"{type(exc).__name__}: {exc}", *secrets)
