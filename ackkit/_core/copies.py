"""What a copy of a delivery carries: retry, dead-letter and restamp copies alike.

Two steps, both here. `retry_headers`, `dead_letter_headers` and
`restamp_headers` are the headers ackkit sets on each kind of copy: pure
functions of the delivery (`Tracked`), the listener's policy, the exception and
the time; they return the Republish's `set_headers` (a value of None removes
that header from the copy). Every copy drops x-delivery-count (the copy is a
new message: a quorum queue's count of the original's deliveries must not come
along) and keeps where the message was first published
(ackkit-original-exchange / -routing-key), from the first copy on.

Then one function, `copy_properties`, decides the basic properties of every copy
ackkit publishes, for every runtime, from the original's and those headers. The
rules (docs/guide/failures.md, "What a copy carries"):

kept
    the original's body, every property and every header not named below,
    with its value and (where the runtime could read the original's bytes) its
    exact AMQP encoding.
dropped on every copy
    headers the broker maintains about a message's past in a queue
    (`BROKER_OWNED`: x-death, x-first-death-*, x-last-death-*,
    x-delivery-count, x-acquired-count, x-stream-offset) and the
    sender-selected distribution headers CC and BCC (on a copy they would
    route it to those queues once more: a duplicate for another consumer),
    and their AMQP 1.0 forms (x-opt-deaths, x-cc);
    `user_id` when it names another user than ackkit's connection (the broker
    refuses such a publish; kept in ackkit-original-user-id).
dropped on retry and dead-letter copies
    the per-message `expiration` (kept in ackkit-original-expiration): a dead
    letter must not silently expire out of the dead-letter queue, and a retry
    copy must wait its delay, not the rest of the producer's TTL (RabbitMQ
    itself removes it when the delay queue dead-letters the copy back). A
    restamp copy goes back to the same queue and keeps it.
added
    the Republish's `set_headers` (ackkit's attempt, reason, error, ...), their
    text made encodable (a lone surrogate becomes U+FFFD) and bounded.
made to fit
    an AMQP content header must fit in one frame (frame_max): the traceback,
    error message and reason are shortened first; then the original's headers
    are left off (ackkit-headers-dropped says how many bytes they were);
    a minimal copy carries the body and ackkit's headers only.

No client library here: the runtime passes `encode`, the function that turns a
property mapping into the bytes its client will send (ackkit's own encoder in
`wire` for both runtimes), and gets back a mapping of AMQP property name to value.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from . import headers as H
from . import wire
from .actions import CopyPurpose
from .policy import ListenerPolicy
from .tb import bounded, format_traceback, qualname, text_of
from .tracked import Tracked

BROKER_OWNED = frozenset(
    {
        "x-death",
        "x-delivery-count",
        "x-acquired-count",  # RabbitMQ 4.3+: deliveries of this message so far
        "x-stream-offset",  # written on deliveries from a stream
        "CC",  # sender-selected distribution: would route the copy again
        "BCC",
        # the same, as RabbitMQ 4.x hands them to an AMQP 1.0 consumer (annotations)
        "x-cc",
        "x-opt-deaths",
    }
)
BROKER_OWNED_PREFIXES = ("x-first-death-", "x-last-death-")

DROPS_EXPIRATION = frozenset({CopyPurpose.RETRY, CopyPurpose.DEAD_LETTER})

TEXT_LIMIT = 32768
"""Longest text value (characters) of a header ackkit sets, before any frame fitting."""
SHRINK_ORDER = (H.ERROR_TRACEBACK, H.ERROR_MESSAGE, H.REASON)
"""ackkit's own headers that give way first when a copy does not fit a frame."""
SHRUNK_TO = 200
NOTE_ROOM = 600
"""Bytes kept free when shortening, for the ackkit-copy-note that says so."""

Encoder = Callable[[Mapping[str, Any]], bytes]

# -- the headers ackkit sets on a copy ---------------------------------------

ERROR_TEXT_LIMIT = 1000
"""Longest ackkit-error-message and ackkit-reason (characters)."""


def iso(ts: float) -> str:
    """A wall-clock timestamp as the ISO 8601 text the failure headers carry (UTC, ms)."""
    return _dt.datetime.fromtimestamp(ts, _dt.UTC).isoformat(timespec="milliseconds")


def _origin(t: Tracked, hdrs: dict[str, Any]) -> None:
    """Name the exchange and routing key `t` was first published with, unless a copy
    before it already did."""
    if not (t.headers and H.ORIGINAL_EXCHANGE in t.headers):
        hdrs[H.ORIGINAL_EXCHANGE] = t.exchange
        hdrs[H.ORIGINAL_ROUTING_KEY] = t.routing_key


def retry_headers(t: Tracked, exc: BaseException, now: float) -> dict[str, Any]:
    """A broker retry copy of `t`, which failed with `exc` at wall-clock time `now`:
    the next attempt's number, the error, and when the failures began and last were."""
    stamp = iso(now)
    hdrs: dict[str, Any] = {
        H.ATTEMPT: t.attempt + 1,
        H.X_DELIVERY_COUNT: None,
        H.LAST_FAILURE: stamp,
        H.ERROR_TYPE: qualname(exc),
        H.ERROR_MESSAGE: bounded(text_of(exc), ERROR_TEXT_LIMIT),
    }
    if not (t.headers and H.FIRST_FAILURE in t.headers):
        hdrs[H.FIRST_FAILURE] = stamp
    _forget_restamp(t, hdrs)
    _origin(t, hdrs)
    return hdrs


def dead_letter_headers(
    t: Tracked,
    policy: ListenerPolicy,
    reason: str,
    exc: BaseException | None,
    tb: str | None,
    now: float,
    attempts: int | None = None,
) -> dict[str, Any]:
    """The dead letter of `t`: why (`reason`), after how many attempts (`attempts`, by
    default the delivery's own), which listener and queue, the error and its traceback
    (`tb`, else formatted from `exc`, cut to the policy's max_traceback), and when."""
    stamp = iso(now)
    old = t.headers or {}
    hdrs: dict[str, Any] = {
        H.REASON: bounded(reason, ERROR_TEXT_LIMIT),
        H.ATTEMPTS: t.attempt if attempts is None else attempts,
        H.LISTENER: policy.name,
        H.ORIGINAL_QUEUE: policy.queue,
        H.ORIGINAL_EXCHANGE: old.get(H.ORIGINAL_EXCHANGE, t.exchange),
        H.ORIGINAL_ROUTING_KEY: old.get(H.ORIGINAL_ROUTING_KEY, t.routing_key),
        H.FIRST_FAILURE: old.get(H.FIRST_FAILURE) or t.first_failure or stamp,
        H.LAST_FAILURE: stamp,
        H.DEAD_LETTERED_AT: stamp,
        H.X_DELIVERY_COUNT: None,
    }
    if exc is not None:
        hdrs[H.ERROR_TYPE] = qualname(exc)
        hdrs[H.ERROR_MESSAGE] = bounded(text_of(exc), ERROR_TEXT_LIMIT)
    if tb is None and exc is not None and exc.__traceback__ is not None:
        tb = format_traceback(exc)  # only dead letters need it; cached per failure
    if tb:
        hdrs[H.ERROR_TRACEBACK] = tb[-policy.max_traceback :]
    _forget_restamp(t, hdrs)
    return hdrs


def _forget_restamp(t: Tracked, hdrs: dict[str, Any]) -> None:
    """A restamp copy's id names that copy only: later copies of it leave it off."""
    if t.headers and H.RESTAMP_ID in t.headers:
        hdrs[H.RESTAMP_ID] = None


def restamp_headers(t: Tracked, restamp_id: str) -> dict[str, Any]:
    """A redelivered `t` going back to its queue: the copy starts at this attempt."""
    hdrs: dict[str, Any] = {
        H.ATTEMPT: t.attempt,
        H.X_DELIVERY_COUNT: None,
        H.RESTAMP_ID: restamp_id,
    }
    _origin(t, hdrs)
    return hdrs


# -- the copy's properties ----------------------------------------------------


@dataclass(frozen=True, slots=True)
class Copy:
    properties: dict[str, Any]
    """AMQP property name -> value; headers' values may be `wire.Field`s (kept bytes)."""
    size: int
    """Bytes of its content header frame."""
    notes: tuple[str, ...] = ()
    """What had to give way (shortened headers, dropped headers), for a log line."""
    encoded: bytes | None = None
    """What the encoder wrote for `properties` as they are (None: not kept): a client
    that sends these bytes need not encode the copy again."""


class Unpublishable(ValueError):
    """Not even a minimal copy fits in a frame (frame_max below what ackkit needs)."""


def broker_owned(name: str) -> bool:
    return name in BROKER_OWNED or name.startswith(BROKER_OWNED_PREFIXES)


def clean_text(value: str, limit: int = TEXT_LIMIT) -> str:
    """`value` as text that encodes as UTF-8, at most `limit` characters."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:  # only lone surrogates fail
        value = "".join("\ufffd" if "\ud800" <= c <= "\udfff" else c for c in value)
    return value if len(value) <= limit else value[: max(limit - 3, 0)] + "..."


def _clean(value: Any, depth: int = 0) -> Any:
    """One of ackkit's header values, made encodable."""
    if isinstance(value, str):
        return clean_text(value)
    if depth > 8:
        return clean_text(repr(value))
    if isinstance(value, Mapping):
        return {clean_text(str(k), 255): _clean(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v, depth + 1) for v in value]
    try:
        wire.encode_value(value)
    except wire.EncodeError:
        return clean_text(repr(value))
    return value


def copy_properties(
    original: Mapping[str, Any] | None,
    set_headers: Mapping[str, Any],
    *,
    purpose: str = CopyPurpose.RETRY,
    minimal: bool = False,
    frame_max: int = 131072,
    user: str | None = None,
    encode: Encoder = wire.encode_properties,
) -> Copy:
    """The properties of a copy of a message with properties `original`.

    `set_headers`: ackkit's headers for this copy (None removes one). `minimal`: the
    original's properties could not be read; the copy carries `set_headers` only.
    `user`: the user ackkit's connection is authenticated as (None: unknown, user_id
    kept). `frame_max`: the connection's negotiated frame size (0: no limit).
    Always returns a copy that `encode` accepts and that fits, unless frame_max is
    too small for ackkit's own headers (Unpublishable).
    """
    notes: list[str] = []
    ours: dict[str, Any] = {}
    removed: set[str] = set()
    last: list[Any] = [None, b""]  # the properties encoded last, and their bytes

    def encode_kept(p: Mapping[str, Any]) -> bytes:
        b = encoder(p)
        last[0], last[1] = p, b
        return b

    encoder, encode = encode, encode_kept
    for k, v in set_headers.items():
        if v is None:
            removed.add(k)
        else:
            ours[clean_text(str(k), 255)] = _clean(v)

    props: dict[str, Any] = {}
    theirs: dict[str, Any] = {}
    if not minimal and original:
        props = {k: v for k, v in original.items() if k in wire.PROPERTY_NAMES and v is not None}
        theirs = {
            k: v
            for k, v in (props.pop("headers", None) or {}).items()
            if not broker_owned(str(k)) and k not in removed and k not in ours
        }
        if purpose in DROPS_EXPIRATION and "expiration" in props:
            ours.setdefault(H.ORIGINAL_EXPIRATION, _clean(_text(props.pop("expiration"))))
        uid = props.get("user_id")
        if uid is not None and user is not None and _text(uid) != user:
            ours.setdefault(H.ORIGINAL_USER_ID, _clean(_text(props.pop("user_id"))))
        props.pop("cluster_id", None)  # deprecated; RabbitMQ refuses nothing, clients differ
        try:
            encode(props)
        except Exception as exc:  # a property the client cannot write: left off
            bad = _bad_properties(props, encode)
            for name in bad:
                props.pop(name)
            notes.append(f"properties {', '.join(bad)} not encodable ({exc})")

    limit = frame_max - wire.FRAME_OVERHEAD if frame_max > 0 else 2**32

    def build(ours: dict[str, Any], with_theirs: bool) -> tuple[dict[str, Any], int] | None:
        hdrs = {**theirs, **ours} if with_theirs else dict(ours)
        p = {**props, "headers": hdrs}
        try:
            n = len(encode(p))
        except Exception:
            return None
        return p, n

    fitted = _fit(theirs, ours, notes, limit, build, encode)
    if fitted is None:
        raise Unpublishable(f"frame_max {frame_max} is too small for ackkit's headers")
    p, n = fitted
    if notes:
        p["headers"][H.COPY_NOTE] = clean_text("; ".join(notes), 500)
        n2 = len(encode(p))
        if n2 > limit:
            del p["headers"][H.COPY_NOTE]
            last[0] = None  # changed since
        else:
            n = n2
    return Copy(p, n + wire.FRAME_OVERHEAD, tuple(notes), last[1] if last[0] is p else None)


def _fit(
    theirs: dict[str, Any],
    ours: dict[str, Any],
    notes: list[str],
    limit: int,
    build: Callable[[dict[str, Any], bool], tuple[dict[str, Any], int] | None],
    encode: Encoder,
) -> tuple[dict[str, Any], int] | None:
    """The copy's properties and their encoded size, within `limit` bytes; `ours` and
    `notes` are changed in place (shortened headers, what was left off)."""
    if theirs:
        got = build(ours, True)
        if got is None:
            notes.append("the original's headers could not be encoded")
        else:
            if got[1] <= limit:
                return got
            full, noted = dict(ours), len(notes)
            if _shrink(ours, got[1] - limit + NOTE_ROOM, notes) is not None:
                got = build(ours, True)
                if got is not None and got[1] <= limit:
                    return got
            ours.clear()
            ours.update(full)  # the original's headers give way instead
            del notes[noted:]
        size = _table_size(theirs, encode)
        ours[H.HEADERS_DROPPED] = size
        notes.append(f"the original's headers ({size} bytes encoded) left off")
    got = build(ours, False)
    if got is None:  # cannot happen with cleaned values; be safe: text only
        for k, v in list(ours.items()):
            ours[k] = clean_text(str(v))
        got = build(ours, False)
        if got is None:
            return None
    if got[1] <= limit:
        return got
    _shrink(ours, got[1] - limit + NOTE_ROOM, notes, floor=0)
    got = build(ours, False)
    if got is not None and got[1] <= limit:
        return got
    p = {"headers": dict(ours)}  # the original's properties give way too
    n = len(encode(p))
    notes.append("the original's properties left off")
    return (p, n) if n <= limit else None


def _text(v: Any) -> str:
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)


def _bad_properties(props: dict[str, Any], encode: Encoder) -> list[str]:
    bad = []
    for name, v in props.items():
        try:
            encode({name: v})
        except Exception:
            bad.append(name)
    return bad or list(props)


def _table_size(table: Mapping[str, Any], encode: Encoder) -> int:
    try:
        return len(encode({"headers": table})) - 2
    except Exception:
        return -1


def _shrink(
    ours: dict[str, Any], excess: int, notes: list[str], floor: int = SHRUNK_TO
) -> int | None:
    """Shorten ackkit's long text headers by about `excess` bytes (to `floor` characters
    at least). Returns the bytes saved, or None when they cannot save enough."""
    saved = 0
    for name in SHRINK_ORDER:
        v = ours.get(name)
        if not isinstance(v, str) or len(v) <= floor:
            continue
        before = len(v.encode("utf-8"))
        keep = max(floor, len(v) - (excess - saved) - 3)
        new = v[-keep:] if name == H.ERROR_TRACEBACK else v[:keep]  # a traceback ends in the error
        ours[name] = new + "..." if name != H.ERROR_TRACEBACK else "..." + new
        saved += before - len(ours[name].encode("utf-8"))
        notes.append(f"{name} shortened to {len(ours[name])} characters")
        if saved >= excess:
            return saved
    return None
