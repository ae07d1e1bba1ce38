"""The source's options (Spark passes them as strings) and the paths derived from them."""

from __future__ import annotations

import hashlib
import os
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum

from .._connection import addresses
from .._core.policy import DLQ_DEFAULT
from ._core.batches import OnInvalid as OnInvalid
from ._store import check_location, child_location, is_local, normalize_location

MAX_PREFETCH = 65535  # basic.qos prefetch-count is a short


class KeyFrom(str, Enum):
    """Which value identifies a message, so that a redelivered copy is recognised."""

    MESSAGE_ID = "message_id"
    """The AMQP message_id property (default). Messages without one are not deduplicated."""
    BODY = "body"
    """SHA-256 of the body: for producers without message ids whose bodies are unique."""
    NONE = "none"
    """No deduplication: after a crash, messages may be in the output twice."""


def _needed(opts: Mapping[str, str], source: str, names: Sequence[str]) -> None:
    """ValueError naming each of `names` that `source`'s options lack or leave empty."""
    missing = [k for k in names if not opts.get(k)]
    if missing:
        raise ValueError(
            f"the {source} source needs option(s) "
            + ", ".join(repr(m) for m in missing)
            + " (checkpoint: the same path as the query's checkpointLocation)"
        )


def _known(opts: Mapping[str, str], source: str, known: set[str]) -> None:
    """ValueError naming each option of `source` that is not in `known`."""
    unknown = sorted(set(opts) - known)
    if unknown:
        raise ValueError(f"unknown {source} source option(s): {', '.join(unknown)}")


def _flag(value: str) -> bool:
    v = value.strip().lower()
    if v in ("1", "true", "yes", "on"):
        return True
    if v in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"not a boolean: {value!r}")


def node_urls(value: str) -> tuple[str, ...]:
    """The node addresses of a source's `url` option (Spark options are strings): one
    URL, the comma form ``amqp://u:p@h1:5672,h2:5672/vhost``, or URLs separated by
    spaces; checked by `ackkit._connection.addresses` (ValueError, passwords masked)."""
    return addresses.parse(value.split())


def url_option(url: str | Sequence[str]) -> str:
    """The `url` option's string for one URL, the comma form or a list of URLs."""
    return url if isinstance(url, str) else " ".join(url)


def local_path(location: str) -> str:
    """A location that must be local (file: URIs accepted), made absolute."""
    if is_local(location):
        return normalize_location(location)
    raise ValueError(f"{location!r}: this needs a local (or mounted) path")


def ipc_address(checkpoint: str | os.PathLike[str], queue: str) -> str:
    """Where the source's runner listens for "batch written" notices (an abstract unix socket
    on Linux, a short socket file elsewhere). Both sides derive it from the same two values
    (the checkpoint as `normalize_location` gives it)."""
    digest = hashlib.sha256(f"{os.fspath(checkpoint)}\0{queue}".encode()).hexdigest()[:24]
    if sys.platform.startswith("linux"):
        return f"\0ackkit-spark-{digest}"
    return os.path.join("/tmp", f"ackkit-spark-{digest}.sock")


def wal_dir(checkpoint: str, queue: str, wal_location: str | None = None) -> str:
    """The queue's write-ahead log: `<wal_location>/<queue>-<hash>`, by default inside the
    checkpoint (`<checkpoint>/ackkit/<queue>-<hash>`)."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", queue)[:80]
    digest = hashlib.sha256(queue.encode()).hexdigest()[:8]
    if wal_location:
        return child_location(wal_location, f"{safe}-{digest}")
    return child_location(checkpoint, "ackkit", f"{safe}-{digest}")


@dataclass(frozen=True)
class SourceOptions:
    """Options of `spark.readStream.format("rabbitmq")`, validated."""

    url: str
    """The first node's URL (the only one for a single node)."""
    queue: str
    checkpoint: str
    """The query's checkpointLocation: a local path or a URI (s3a://, gs://, abfss://...)."""
    max_batch: int = 20_000
    """Most messages in one micro-batch (option maxMessagesPerTrigger; `max_batch` is its
    former name, still accepted)."""
    max_bytes: int | None = None
    """Most body bytes in one micro-batch, unless one message alone is larger (option
    maxBytesPerTrigger); None: no byte cap."""
    prefetch: int = 20_000
    """Unacked deliveries the broker may push (basic.qos); at least max_batch."""
    model: str | None = None
    """"package.module:Class" of a pydantic model: its fields become columns."""
    on_invalid: OnInvalid = OnInvalid.FAIL
    dead_letter_queue: str = DLQ_DEFAULT
    key: KeyFrom = KeyFrom.MESSAGE_ID
    max_wait: float = 0.5
    """Seconds a read waits for the first message before reporting "no new data"."""
    linger: float = 0.05
    """Once messages flow, a read returns when none came for this long (or max_batch)."""
    heartbeat: int = 30
    exclusive: bool = True
    """Consume exclusively: the exactly-once guarantee assumes no other consumer."""
    declare: bool = True
    """Declare the queue (durable, no arguments) when it does not exist."""
    fsync: bool = True
    retain_batches: int = 10
    """Written batches whose rows stay in the write-ahead log (deduplication window)."""
    wal_location: str | None = None
    """Where the write-ahead logs live, when not inside the checkpoint (a path or a URI)."""
    exclusive_wait: float = 60.0
    """Seconds to wait while another consumer holds the queue exclusively (a previous
    runner shutting down, or another query) before the query fails."""
    urls: tuple[str, ...] = ()
    """Every node's URL in the order they are tried (`url` alone when not given)."""

    def __post_init__(self) -> None:
        if not self.urls:
            object.__setattr__(self, "urls", (self.url,))

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SourceOptions:
        opts = {k.lower(): v for k, v in options.items()}
        _needed(opts, "rabbitmq", ("url", "queue", "checkpoint"))
        known = {
            "url",
            "queue",
            "checkpoint",
            MAX_MESSAGES,
            MAX_BATCH_OLD,
            MAX_BYTES,
            "prefetch",
            "model",
            "on_invalid",
            "dead_letter_queue",
            "key",
            "max_wait_ms",
            "linger_ms",
            "heartbeat",
            "exclusive",
            "declare",
            "fsync",
            "retain_batches",
            "wal_location",
            "exclusive_wait_ms",
            "path",
        }
        _known(opts, "rabbitmq", known)
        max_batch = _max_messages(opts)
        max_bytes = _int(opts, MAX_BYTES, 0, 1) if MAX_BYTES in opts else None
        if "prefetch" in opts:
            prefetch = _int(opts, "prefetch", 0, 1, MAX_PREFETCH)
        else:
            prefetch = min(max(2 * max_batch, 100), MAX_PREFETCH)
        if not 1 <= prefetch <= MAX_PREFETCH:
            raise ValueError(f"prefetch must be in 1..{MAX_PREFETCH}")
        # A batch never waits for more than the broker may have in flight: cap it.
        max_batch = min(max_batch, prefetch)
        urls = node_urls(opts["url"])
        return cls(
            url=urls[0],
            urls=urls,
            queue=opts["queue"],
            checkpoint=check_location(opts["checkpoint"]),
            max_batch=max_batch,
            max_bytes=max_bytes,
            prefetch=prefetch,
            model=opts.get("model") or None,
            on_invalid=OnInvalid(opts.get("on_invalid", OnInvalid.FAIL.value).lower()),
            dead_letter_queue=opts.get("dead_letter_queue", DLQ_DEFAULT),
            key=KeyFrom(opts.get("key", KeyFrom.MESSAGE_ID.value).lower()),
            max_wait=_int(opts, "max_wait_ms", 500, 0, 3_600_000) / 1000,
            linger=_int(opts, "linger_ms", 50, 0, 3_600_000) / 1000,
            heartbeat=_int(opts, "heartbeat", 30, 0, 65535),
            exclusive=_flag(opts.get("exclusive", "true")),
            declare=_flag(opts.get("declare", "true")),
            fsync=_flag(opts.get("fsync", "true")),
            retain_batches=_int(opts, "retain_batches", 10, 0),
            wal_location=check_location(opts["wal_location"]) if opts.get("wal_location") else None,
            exclusive_wait=_int(opts, "exclusive_wait_ms", 60_000, 0, 86_400_000) / 1000,
        )

    @property
    def wal_dir(self) -> str:
        return wal_dir(self.checkpoint, self.queue, self.wal_location)

    @property
    def address(self) -> str:
        return ipc_address(self.checkpoint, self.queue)


# Spark's own names for a source's per-trigger caps (maxOffsetsPerTrigger, maxFilesPerTrigger,
# maxBytesPerTrigger); options arrive lower-cased.
MAX_MESSAGES = "maxmessagespertrigger"
MAX_BYTES = "maxbytespertrigger"
MAX_BATCH_OLD = "max_batch"  # the former name of maxMessagesPerTrigger
_SPELLED = {MAX_MESSAGES: "maxMessagesPerTrigger", MAX_BYTES: "maxBytesPerTrigger"}


def _max_messages(opts: Mapping[str, str]) -> int:
    """maxMessagesPerTrigger, or its former name max_batch (both: they must agree)."""
    new = _int(opts, MAX_MESSAGES, 0, 1) if MAX_MESSAGES in opts else None
    old = _int(opts, MAX_BATCH_OLD, 0, 1) if MAX_BATCH_OLD in opts else None
    if new is not None and old is not None and new != old:
        raise ValueError(
            f"rabbitmq source options maxMessagesPerTrigger ({new}) and max_batch ({old}) "
            "disagree: max_batch is the former name of maxMessagesPerTrigger, give one"
        )
    return new if new is not None else old if old is not None else 20_000


def _int(opts: Mapping[str, str], name: str, default: int, lo: int, hi: int | None = None) -> int:
    """Option `name` as an int in [lo, hi] (`default` when absent), else a ValueError
    that names it (Spark hands every option over as a string)."""
    raw = opts.get(name)
    if raw is None:
        return default
    shown = _SPELLED.get(name, name)
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise ValueError(
            f"rabbitmq source option {shown} must be an integer, got {raw!r:.80}"
        ) from None
    if value < lo or (hi is not None and value > hi):
        bound = f">= {lo}" if hi is None else f"between {lo} and {hi}"
        raise ValueError(f"rabbitmq source option {shown} must be {bound}, got {value}")
    return value
