"""What @app.listener records, shared by the sync and asyncio apps."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ._core.events import Event, Observer
from ._core.policy import (
    DLQ_DEFAULT,
    NO_RETRY,
    AckMode,
    FlushPolicy,
    ListenerPolicy,
    Retry,
    RetryStrategy,
    Unsettled,
)
from ._handler import DEFAULT_MAX_BODY, Binding, Decoder
from ._url import mask_url

log = logging.getLogger("ackkit")
F = TypeVar("F", bound=Callable[..., Any])

# RabbitMQ's default consumer_timeout (30 min); in-process retries must end well before it.
CONSUMER_TIMEOUT = 30 * 60.0


@dataclass(frozen=True)
class ListenerSpec:
    """One registered listener: its policy, its handler binding and how it runs."""

    policy: ListenerPolicy
    binding: Binding
    concurrency: int = 1
    batch_size: int | None = None
    batch_timeout: float = 0.2
    declare: bool = True
    queue_arguments: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.policy.name

    @property
    def queue(self) -> str:
        return self.policy.queue


class AppBase:
    """Listener registry and settings shared by App (pika) and AsyncApp (aio-pika)."""

    def __init__(
        self,
        url: str = "amqp://guest:guest@127.0.0.1:5672/%2f",
        *,
        heartbeat: int = 30,
        shutdown_timeout: float = 30.0,
        reconnect_max_interval: float = 15.0,
        startup_timeout: float = 60.0,
        connection_name: str = "ackkit",
    ) -> None:
        self.url = url
        self.heartbeat = heartbeat
        self.shutdown_timeout = shutdown_timeout
        self.reconnect_max_interval = reconnect_max_interval
        self.startup_timeout = startup_timeout
        self.connection_name = connection_name
        self.specs: list[ListenerSpec] = []
        self._observers: list[Observer] = []

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {mask_url(self.url)} listeners={len(self.specs)}>"

    @property
    def safe_url(self) -> str:
        return mask_url(self.url)

    def on_event(self, fn: Observer) -> Observer:
        """Register a lifecycle observer (called for every stage of every delivery)."""
        self._observers.append(fn)
        return fn

    def _observer(self) -> Observer | None:
        if not self._observers:
            return None
        obs = tuple(self._observers)

        def fan_out(ev: Event) -> None:
            for o in obs:
                try:
                    o(ev)
                except Exception:
                    log.exception("ackkit event observer failed")

        return fan_out

    def listener(
        self,
        queue: str,
        *,
        ack_mode: AckMode = AckMode.AUTO,
        prefetch: int = 250,
        retry: Retry | None = None,
        dead_letter: str | None = DLQ_DEFAULT,
        on_unsettled: Unsettled = Unsettled.DEAD_LETTER,
        concurrency: int = 1,
        max_concurrency: int | None = None,
        batch_size: int | None = None,
        batch_timeout: float = 0.2,
        max_body_size: int = DEFAULT_MAX_BODY,
        check_content_type: bool = True,
        declare: bool = True,
        queue_arguments: dict[str, Any] | None = None,
        flush: FlushPolicy | None = None,
        name: str | None = None,
    ) -> Callable[[F], F]:
        """Register a handler for `queue`.

        The first parameter's annotation says what the handler gets: a pydantic
        model (the JSON body validated), `Delivery`, `bytes`, `str`, `dict`/any
        (JSON), or `list[...]` of one of those for a batch handler. A second
        parameter annotated `Delivery` receives the delivery as well.
        """
        conc = max_concurrency if max_concurrency is not None else concurrency
        if conc < 1:
            raise ValueError("concurrency must be >= 1")
        if batch_size is not None and prefetch and batch_size > prefetch:
            raise ValueError(f"batch_size {batch_size} > prefetch {prefetch}: batches never fill")
        r = retry or NO_RETRY
        if r.strategy is RetryStrategy.IN_PROCESS and r.total_delay() > CONSUMER_TIMEOUT / 2:
            log.warning(
                "listener on %r: in-process retries may wait %.0f s, close to RabbitMQ's "
                "consumer_timeout (%.0f s by default); use RetryStrategy.BROKER",
                queue,
                r.total_delay(),
                CONSUMER_TIMEOUT,
            )

        def register(fn: F) -> F:
            lname = name or f"{queue}:{getattr(fn, '__name__', 'handler')}"
            policy = ListenerPolicy(
                name=lname,
                queue=queue,
                mode=ack_mode,
                prefetch=prefetch,
                retry=r,
                dead_letter=dead_letter,
                on_unsettled=on_unsettled,
                flush=flush,
            )
            binding = Binding(fn, Decoder(max_body_size, check_content_type), lname)
            if batch_size is None and binding.batch:
                raise TypeError(f"{lname}: a list[...] handler needs batch_size=")
            if batch_size is not None and not binding.batch:
                raise TypeError(f"{lname}: batch_size= needs a handler taking list[...]")
            self._check_handler(binding)
            self.specs.append(
                ListenerSpec(
                    policy,
                    binding,
                    conc,
                    batch_size,
                    batch_timeout,
                    declare,
                    dict(queue_arguments or {}),
                )
            )
            return fn

        return register

    def _check_handler(self, binding: Binding) -> None:
        """Runtimes refuse handler kinds they cannot run."""

    def __iter__(self) -> Iterator[ListenerSpec]:
        return iter(self.specs)
