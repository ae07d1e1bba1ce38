"""Options of the `rabbitmq-stream` source (Spark passes them as strings)."""

from __future__ import annotations

import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field

from ..streams import stream_connection
from ._core.batches import OnInvalid
from ._core.stream_offsets import StartFrom, StartingPosition
from ._options import _flag, _int, _known, _needed, node_urls
from ._store import check_location

STREAM_PORT = 5552


@dataclass(frozen=True)
class StreamSourceOptions:
    """Options of `spark.readStream.format("rabbitmq-stream")`, validated."""

    url: str
    """The broker's AMQP URL (the first node's): host, credentials and virtual host of
    the stream connection (and the connection that dead-letters invalid records)."""
    checkpoint: str
    """The query's checkpointLocation (the source keeps its starting positions there)."""
    stream: str | None = None
    """A plain stream to read (one Spark input partition)."""
    super_stream: str | None = None
    """A super stream: each of its partition streams is one Spark input partition."""
    stream_port: int = STREAM_PORT
    starting_position: StartingPosition = field(
        default_factory=lambda: StartingPosition(StartFrom.EARLIEST)
    )
    max_messages_per_trigger: int | None = None
    """At most this many records in one micro-batch, shared fairly by the partitions."""
    fail_on_data_loss: bool = True
    """Unread offsets removed by retention fail the query (false: count, log, go on)."""
    model: str | None = None
    on_invalid: OnInvalid = OnInvalid.FAIL
    dead_letter_queue: str | None = None
    """Where invalid records go with on_invalid=dead_letter (default "<name>.dlq")."""
    store_offsets_as: str | None = None
    """Also store each committed position on the broker under this consumer name, for
    other tools to see. Never read back: the checkpoint is the truth."""
    probe_timeout: float = 1.0
    """Seconds the driver waits for a partition's first/last chunk before taking the
    partition as empty."""
    read_timeout: float = 120.0
    """Seconds an executor waits for more of its range before failing the task."""
    urls: tuple[str, ...] = ()
    """Every node's URL in the order they are tried (`url` alone when not given)."""

    def __post_init__(self) -> None:
        if not self.urls:
            object.__setattr__(self, "urls", (self.url,))

    @property
    def name(self) -> str:
        """The stream or super stream: what the source's offsets are labelled with."""
        return self.super_stream or self.stream or ""

    @property
    def dlq(self) -> str:
        return self.dead_letter_queue or f"{self.name}.dlq"

    @property
    def connection(self) -> dict[str, object]:
        """Keyword arguments of an rstream Consumer/Producer for this broker; with
        several node addresses, `hosts` lists every node's host in order (the stream
        port is `stream_port` on each): the first connection tries them in turn."""
        conn = stream_connection(self.url, self.stream_port)
        if len(self.urls) > 1:
            conn["hosts"] = tuple(urllib.parse.urlsplit(u).hostname or "" for u in self.urls)
        return conn

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> StreamSourceOptions:
        opts = {k.lower(): v for k, v in options.items()}
        known = {
            "url",
            "checkpoint",
            "stream",
            "super_stream",
            "stream_port",
            "starting_position",
            "max_messages_per_trigger",
            "fail_on_data_loss",
            "model",
            "on_invalid",
            "dead_letter_queue",
            "store_offsets_as",
            "probe_timeout_ms",
            "read_timeout_ms",
            "path",
        }
        _known(opts, "rabbitmq-stream", known)
        _needed(opts, "rabbitmq-stream", ("url", "checkpoint"))
        if bool(opts.get("stream")) == bool(opts.get("super_stream")):
            raise ValueError("the rabbitmq-stream source needs one of stream= or super_stream=")
        limit = opts.get("max_messages_per_trigger")
        urls = node_urls(opts["url"])
        return cls(
            url=urls[0],
            urls=urls,
            checkpoint=check_location(opts["checkpoint"]),
            stream=opts.get("stream") or None,
            super_stream=opts.get("super_stream") or None,
            stream_port=_int(opts, "stream_port", STREAM_PORT, 1, 65535),
            starting_position=StartingPosition.parse(opts.get("starting_position", "earliest")),
            max_messages_per_trigger=(
                _int(opts, "max_messages_per_trigger", 0, 1) if limit is not None else None
            ),
            fail_on_data_loss=_flag(opts.get("fail_on_data_loss", "true")),
            model=opts.get("model") or None,
            on_invalid=OnInvalid(opts.get("on_invalid", OnInvalid.FAIL.value).lower()),
            dead_letter_queue=opts.get("dead_letter_queue") or None,
            store_offsets_as=opts.get("store_offsets_as") or None,
            probe_timeout=_int(opts, "probe_timeout_ms", 1000, 1, 600_000) / 1000,
            read_timeout=_int(opts, "read_timeout_ms", 120_000, 1, 86_400_000) / 1000,
        )
