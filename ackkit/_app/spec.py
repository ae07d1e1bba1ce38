"""What @app.listener records, shared by the sync and asyncio apps."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import ssl
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from .._connection.tls import TLS
from .._core import checks as C
from .._core.events import Observer
from .._core.exchanges import Bind, Exchange, Plan, plan
from .._core.flow import FlowState
from .._core.policy import (
    DLQ_DEFAULT,
    NO_RETRY,
    AckMode,
    ListenerPolicy,
    Retry,
    RetryStrategy,
    Unsettled,
)
from .._core.topology import check_delivery_limit
from .._telemetry.logs import LifecycleLog
from .asyncapi import document
from .handler import Binding, Decoder
from .launch import Launch
from .listener_options import check_inbox as _check_inbox
from .listener_options import translate as _translate
from .listener_spec import Instrument as Instrument
from .listener_spec import ListenerSpec as ListenerSpec
from .listener_spec import probe_for as probe_for
from .listener_values import Batch, Consumer, Flow, Publication, Queue, publications
from .settings import DEFAULT_URL, Settings, SettingsView

if TYPE_CHECKING:
    from .._core.listener import ListenerCore
    from ..inbox import Inbox

log = logging.getLogger("ackkit")
F = TypeVar("F", bound=Callable[..., Any])
R = TypeVar("R", bound="RunState")

# RabbitMQ's default consumer_timeout (30 min); in-process retries must end well before it.
CONSUMER_TIMEOUT = 30 * 60.0

SETTLED_BY_HANDLER = (AckMode.MANUAL, AckMode.CLIENT, AckMode.INDIVIDUAL)
"""Ack modes in which the handler settles: it must receive its Delivery."""


class RunState(Protocol):
    """What the app base reads of its running runtime."""

    @property
    def stopping(self) -> bool: ...

    @property
    def fatal(self) -> BaseException | None: ...


class AppBase(SettingsView):
    """Listener registry and settings shared by App (pika) and AsyncApp (aio-pika).

    Options (keyword only after the URL; each checked here, a wrong one raises
    ValueError or TypeError naming it):

    - `url`: the broker, ``amqp://user:password@host:port/vhost`` or ``amqps://``;
      for a cluster, a list of such URLs (one per node) or the comma form
      ``amqp://user:password@host1:5672,host2:5673/vhost``: the first is tried first,
      and after a failed attempt or a lost connection the next one (wrapping).
    - `heartbeat`: AMQP heartbeat in seconds (0 turns it off); 30.
    - `shutdown_timeout`: seconds a graceful stop waits for running handlers
      before their deliveries are left to the broker to requeue; 30.
    - `reconnect_max_interval`: the longest wait between reconnect attempts (s); 15.
    - `startup_timeout`: seconds `start()`/`run()` waits for a first connection
      before raising `ConnectFailed`; 60.
    - `connection_name`: the name the broker shows for the connection; "ackkit".
    - `tls`: an `ackkit.TLS` or an `ssl.SSLContext` for an amqps:// URL.
    - `protocol`: "amqp0-9-1" (the default) or "amqp1.0": the App's listeners consume
      and publish over AMQP 1.0 (RabbitMQ 4.0 or later, python-qpid-proton installed:
      ``pip install ackkit[amqp10]``); see the AMQP 1.0 guide. AsyncApp speaks 0-9-1.
    """

    _runtime: RunState | None = None
    _protocols: tuple[str, ...] = ("amqp0-9-1", "amqp1.0")
    """The `protocol` values this kind of app runs on."""

    def __init__(
        self,
        url: str | Sequence[str] = DEFAULT_URL,
        *,
        heartbeat: int = 30,
        shutdown_timeout: float = 30.0,
        reconnect_max_interval: float = 15.0,
        startup_timeout: float = 60.0,
        connection_name: str = "ackkit",
        tls: TLS | ssl.SSLContext | None = None,
        protocol: str = "amqp0-9-1",
    ) -> None:
        self.settings = Settings.check(
            url,
            heartbeat=heartbeat,
            shutdown_timeout=shutdown_timeout,
            reconnect_max_interval=reconnect_max_interval,
            startup_timeout=startup_timeout,
            connection_name=connection_name,
            tls=tls,
            protocol=protocol,
        )
        self._check_protocol()
        self.specs: list[ListenerSpec] = []
        self._declared: tuple[Exchange | Queue, ...] = ()  # app.declare(...)
        self._observers: list[Observer] = []
        self._instruments: list[Instrument] = []
        # listener name -> (spec, core) of the latest runtime; kept after it stops
        self._cores: dict[str, tuple[ListenerSpec, ListenerCore]] = {}

    def _check_protocol(self) -> None:
        p = self.settings.protocol
        if p not in self._protocols:
            raise ValueError(
                f"{type(self).__name__} speaks {' and '.join(self._protocols)}, not "
                f"protocol={p!r}: over AMQP 1.0, run your listeners on App"
            )

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.safe_url} listeners={len(self.specs)}>"

    # -- state shared by both apps ------------------------------------------------------

    @property
    def is_running(self) -> bool:
        """True while the app consumes: False once stopped, or once it failed."""
        rt = self._runtime
        return rt is not None and rt.fatal is None and not rt.stopping

    def stats(self) -> dict[str, dict[str, int]]:
        """Lifecycle counters per listener (received, acked, dead_lettered, ...).

        After the app stopped: the counters its last run ended with; `{}` before
        the first start."""
        return {name: core.counters.snapshot() for name, (_, core) in self._cores.items()}

    # -- what a runtime is given ------------------------------------------------------

    def on_event(self, fn: Observer) -> Observer:
        """Register a lifecycle observer (called for every stage of every delivery).

        Observers run on a thread of their own, one event after the other in the order
        they happened, never on the connection's I/O thread: a slow observer delays
        later events, not acks, heartbeats or handlers. They have all been called by
        the time `stop()` returns (waiting at most 5 s for them)."""
        self._observers.append(fn)
        return fn

    def _observer(self) -> Observer:
        """ackkit's own observer for a runtime's listener cores, called in place: the log
        lines about dead letters, rejections, unsettled and stale deliveries. (The
        registered ones go to the runtime as `observers`: they run on a thread of their
        own, see `ackkit._telemetry.observers`.)"""
        return LifecycleLog({s.name: s.queue for s in self.specs})

    def _add_instrument(self, fn: Instrument) -> None:
        """Instrument the listeners of every runtime started from now on (metrics, tracing)."""
        self._instruments.append(fn)

    def _run_instruments(self) -> tuple[Instrument, ...]:
        """The instruments a new runtime calls for each listener core it builds: the app's
        own (it remembers the core, for `stats()` and metrics), then the registered ones."""
        self._cores.clear()
        return (self._remember, *self._instruments)

    def _remember(self, spec: ListenerSpec, core: ListenerCore) -> None:
        self._cores[spec.name] = (spec, core)

    @contextlib.contextmanager
    def _starting(self, kind: str, runtime: Callable[..., R]) -> Iterator[R]:
        """A new `runtime` (the App's or the AsyncApp's class) for the listeners, the
        app's from now on, for the with-block to start; if the block raises, the app
        has none again. First the checks every start makes: the app (`kind`, as the
        errors name it) is not running already and has a listener."""
        if self._runtime is not None:
            raise RuntimeError(f"{kind} is already running")
        self._check_protocol()
        if not self.specs:
            raise RuntimeError(f"{kind} has no listeners: register one with @app.listener(...)")
        rt = runtime(
            Launch(
                self.settings,
                self.specs,
                observer=self._observer(),
                observers=tuple(self._observers),
                instruments=self._run_instruments(),
                topology=self._plan(),
            )
        )
        self._runtime = rt
        try:
            yield rt
        except BaseException:
            self._runtime = None
            raise

    def listener(
        self,
        queue: str | Queue,
        *,
        consumer: Consumer | None = None,
        ack_mode: AckMode = AckMode.AUTO,
        on_unsettled: Unsettled = Unsettled.DEAD_LETTER,
        retry: Retry | None = None,
        dead_letter: str | None = DLQ_DEFAULT,
        batch: Batch | None = None,
        flow: Flow | None = None,
        inbox: Inbox | None = None,
        name: str | None = None,
        publishes: Publication | Sequence[Publication] | None = None,
        **deprecated: Any,
    ) -> Callable[[F], F]:
        """Register a handler for `queue` (a queue name, or a `Queue` to declare it with
        arguments or bind it to exchanges).

        The first parameter's annotation says what the handler gets: a pydantic
        model (the JSON body validated), `Delivery`, `bytes`, `str`, `dict`/any
        (JSON), or `list[...]` of one of those for a batch handler (with `batch=`). A
        second parameter annotated `Delivery` receives the delivery as well.

        - `consumer`: a `Consumer` (prefetch, concurrency, exclusive, priority, ...).
        - `ack_mode` and `on_unsettled`: who settles, and what happens to a delivery a
          settling handler left unsettled.
        - `retry` (a `Retry`) and `dead_letter` (the dead-letter queue, None for none).
        - `batch`: a `Batch(size, timeout)` for a `list[...]` handler.
        - `flow`: a `Flow` (circuit breaker, rate limit, serial key).
        - `inbox=Inbox(dsn)`: exactly-once database effects (see `ackkit.inbox.Inbox`):
          the handler runs in a PostgreSQL transaction that records the message's key,
          committed before the ack; a redelivery of a recorded key is acked unrun.
        - `name`: the listener's name in stats, metrics and logs ("queue:function").
        - `publishes`: a `Publication` or a list of them: what the handler publishes,
          listed in the AsyncAPI document (`ackkit docs`) as send operations.

        The flat options of ackkit 0.1 (`prefetch=`, `max_concurrency=`, `batch_size=`,
        `queue_arguments=`, ...) still work, with a DeprecationWarning naming the new
        spelling; they go in 0.3.
        """
        q, cons, batch, fl = _translate(queue, consumer, batch, flow, deprecated)
        queue = q.name
        ack_mode = C.enum("ack_mode", AckMode, ack_mode)
        prefetch = cons.prefetch
        if batch is not None and prefetch and batch.size > prefetch:
            raise ValueError(
                f"Batch.size {batch.size} > Consumer.prefetch {prefetch}: batches never fill"
            )
        args = q.arguments
        if name is not None:
            C.text("name", name)
        sends = publications(publishes)
        if retry is not None and not isinstance(retry, Retry):
            raise TypeError(f"retry must be a Retry or None, got {retry!r}")
        r = retry or NO_RETRY
        check_delivery_limit(r, args)
        flow_policy = fl.policy()
        if fl.serial_key is not None and batch is not None:
            raise ValueError(
                "Flow(serial_key=...) with batch=: a batch would run deliveries of one key "
                "together and out of the gate's order; use one or the other"
            )
        if inbox is not None:
            _check_inbox(inbox, ack_mode, batch)
        # ListenerPolicy checks the rest (dead_letter, on_unsettled, flush) before the
        # handler is bound, so a wrong option fails at the decorator's line.
        probe = ListenerPolicy(
            name=name or "?",
            queue=queue,
            mode=ack_mode,
            prefetch=prefetch,
            retry=r,
            dead_letter=dead_letter,
            on_unsettled=on_unsettled,
            flush=cons.flush,
            queue_type=q.queue_type,
            quorum=q.quorum,
            flow=flow_policy,
        )
        limit = CONSUMER_TIMEOUT if cons.timeout is None else cons.timeout
        if r.strategy is RetryStrategy.IN_PROCESS and r.total_delay() > limit / 2:
            log.warning(
                "listener on %r: in-process retries may wait %.0f s, close to the "
                "consumer timeout (%.0f s); use RetryStrategy.BROKER",
                queue,
                r.total_delay(),
                limit,
            )
        bound = q.bind
        batch_size = None if batch is None else batch.size
        batch_timeout = 0.2 if batch is None else batch.timeout

        def register(fn: F) -> F:
            lname = name or f"{queue}:{getattr(fn, '__name__', 'handler')}"
            if any(s.name == lname for s in self.specs):
                raise ValueError(
                    f"a listener named {lname!r} is already registered on this app; give "
                    "each listener its own name= (stats, metrics and logs are keyed by it)"
                )
            policy = dataclasses.replace(probe, name=lname)
            decoder = Decoder(cons.max_body_size, cons.check_content_type)
            binding = Binding(fn, decoder, lname)
            if batch_size is None and binding.batch:
                raise TypeError(f"{lname}: a list[...] handler needs batch=Batch(size)")
            if batch_size is not None and not binding.batch:
                raise TypeError(f"{lname}: batch= needs a handler taking list[...]")
            if ack_mode in SETTLED_BY_HANDLER and not binding.gets_delivery:
                raise TypeError(
                    f"{lname}: with ack_mode={ack_mode} the handler settles each message "
                    "itself, so it must receive the Delivery: leave its first parameter "
                    "unannotated or annotate it `Delivery`, or add a second parameter "
                    "annotated `Delivery` (e.g. `def handle(body: dict, msg: Delivery)`); "
                    "or use AckMode.AUTO"
                )
            self._check_handler(binding)
            if inbox is not None:
                self._check_inbox_handler(binding)
            # One exchange declared two ways: TopologyConflict, here.
            self._plan(extra=[(queue, bound)])
            self.specs.append(
                ListenerSpec(
                    policy,
                    binding,
                    cons.concurrency,
                    batch_size,
                    batch_timeout,
                    q.declare,
                    args,
                    bound,
                    cons.consume_arguments(),
                    cons.exclusive,
                    inbox,
                    sends,
                )
            )
            return fn

        return register

    def declare(self, *items: Exchange | Queue) -> None:
        """Declare exchanges, and queues no listener consumes with their bindings (an
        outbox's target, an audit queue), each time the app connects: at start and after
        every reconnect, before the listeners consume. From the next start.

        ```
        app.declare(
            Exchange("orders", ExchangeType.TOPIC),
            Queue("orders.audit", bind=("orders", "order.#")),
        )
        ```

        A `Queue` with `declare=False` is only checked; one without arguments that exists
        already is left as it is. An exchange declared two ways by the app (here or in a
        listener's `bind=`), a queue declared two ways here, or a listener's queue named
        here raise TopologyConflict at once; a refusal by the broker (an exchange or
        queue that exists with other options) at start."""
        for item in items:
            if not isinstance(item, Exchange | Queue):
                raise TypeError(
                    f"declare() takes Exchange and Queue values (ackkit.topology.Exchange, "
                    f"ackkit.Queue), got {item!r}"
                )
        self._plan(declared=self._declared + items)  # TopologyConflict, here
        self._declared += items

    def _plan(
        self,
        extra: Sequence[tuple[str, Sequence[Bind]]] = (),
        declared: Sequence[Exchange | Queue] | None = None,
    ) -> Plan:
        """What a runtime declares besides the listeners' queues: the listeners' exchanges
        and bindings (and `extra` ones), and what `declare()` named (or `declared`)."""
        items = self._declared if declared is None else declared
        return plan(
            [*((s.queue, s.binds) for s in self.specs), *extra],
            [e for e in items if isinstance(e, Exchange)],
            [(q.name, q.declare, q.arguments, q.bind) for q in items if isinstance(q, Queue)],
        )

    def asyncapi(self, *, title: str = "ackkit app", version: str = "1.0.0") -> dict[str, Any]:
        """An AsyncAPI 3.0 document (a JSON-ready dict) of the registered listeners: their
        queues, exchange bindings, dead-letter and retry queues, payload schemas."""
        return document(self, title=title, version=version)

    def _check_handler(self, binding: Binding) -> None:
        """Runtimes refuse handler kinds they cannot run."""

    def _check_inbox_handler(self, binding: Binding) -> None:
        """Runtimes refuse handler kinds they cannot run in an inbox transaction."""

    def _listener_name(self, name: str | None) -> None:
        if name is not None and all(s.name != name for s in self.specs):
            names = ", ".join(repr(s.name) for s in self.specs)
            raise ValueError(f"no listener named {name!r} on this app (listeners: {names})")

    def flow_state(self) -> dict[str, FlowState]:
        """Per listener: consuming, paused (by hand), tripped (circuit breaker open),
        probing (half-open), standby (another consumer holds its queue exclusively) or
        refused (the broker refuses its copies: waiting before it consumes again), as the
        latest run left it."""
        return {name: core.gating.flow.state for name, (_, core) in self._cores.items()}

    def __iter__(self) -> Iterator[ListenerSpec]:
        return iter(self.specs)
