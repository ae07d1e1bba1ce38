"""The handle of a provisioned broker, whatever provided it.

:class:`BrokerHandle` talks AMQP (connect, ping, purge, delete), reads counts
(:mod:`._queries`) and refuses node control; the providers
(``_provider_url``, ``_provider_docker``, and ackkit-testkit's nodes) override what
their kind of broker can do.
"""

from __future__ import annotations

import contextlib
import logging
import re
import time
import urllib.parse
from collections.abc import Callable, Iterator, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

from ..cli._queues import ctl_list_queues
from ._env import ENV_URL
from ._errors import BrokerError, BrokerNotOwned, QueueNotFound
from ._helpers import KitHelpers, counts_not_reached, counts_reached, wanted_counts
from ._policies import PolicyControl
from ._queries import (
    DeclaredQueue,
    QueueCounts,
    _bindings_expr,
    _close_all_expr,
    _close_named_expr,
    _counts_all_expr,
    _declared_expr,
    _exchange_types_expr,
    _json_rows,
    _parse_list_queues_json,
    _queue_counts_expr,
    _read_bindings,
    _read_counts_all,
    _read_declared,
    _read_declared_json,
    _read_exchange_types,
    _read_queue_counts,
)
from ._util import amqp_greets as _amqp_greets
from ._util import mask_url

__all__ = ["BrokerHandle"]

log = logging.getLogger("ackkit.testing")

if TYPE_CHECKING:
    from .._app.spec import AppBase

_H = TypeVar("_H", bound="BrokerHandle")
_A = TypeVar("_A", bound="AppBase")
_R = TypeVar("_R")
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r"}  # of an Erlang string; any other is the character


def _pika() -> Any:
    import pika

    return pika


class BrokerHandle(KitHelpers, PolicyControl):
    """A provisioned broker. Use :func:`provision_broker` to get one.

    Attributes: ``url`` (amqp URL), ``own`` (True when the kit started the node,
    so restart/stop/start/kill are allowed), ``amqp_port``, ``node_name`` (None
    when unknown), ``vhost``, ``kind`` ("url", "docker" or "own").
    """

    kind = "?"

    def __init__(
        self,
        url: str,
        *,
        own: bool,
        amqp_port: int,
        node_name: str | None,
        vhost: str = "/",
    ) -> None:
        self._url = url
        self.own = own
        self.amqp_port = amqp_port
        self.node_name = node_name
        self.vhost = vhost
        self._closed = False

    # -- identity ---------------------------------------------------------------

    @property
    def url(self) -> str:
        return self._url

    @property
    def masked_url(self) -> str:
        return mask_url(self._url)

    def __repr__(self) -> str:
        return (
            f"<{type(self).__name__} kind={self.kind} url={self.masked_url} "
            f"node={self.node_name} own={self.own}>"
        )

    __str__ = __repr__

    # -- apps -------------------------------------------------------------------

    @contextlib.contextmanager
    def attach(self, app: _A) -> Iterator[_A]:
        """Point `app` (an App or AsyncApp built with any URL, e.g. your production
        settings') at this broker for the with-block, and give its URL back after it;
        start it inside. The same on the in-memory broker and a real one::

            with amqp_broker.attach(app), app.running(): ...
            with amqp_broker.attach(app):
                async with app.running(): ...
        """
        if getattr(app, "is_running", False):
            raise RuntimeError("attach() an app before starting it")
        url = app.url
        app.url = self.url
        try:
            yield app
        finally:
            app.url = url

    # -- lifetime ---------------------------------------------------------------

    def __enter__(self: _H) -> _H:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Release the broker (stop and remove a node or container the kit started)."""
        self._closed = True

    @property
    def closed(self) -> bool:
        return self._closed

    # -- AMQP -------------------------------------------------------------------

    def connection_parameters(self, **overrides: Any) -> Any:
        """``pika.URLParameters`` for this broker; keyword arguments override fields."""
        params = _pika().URLParameters(self._url)
        for key, value in overrides.items():
            setattr(params, key, value)
        return params

    def connect(self, **overrides: Any) -> Any:
        """A new ``pika.BlockingConnection``; the caller closes it."""
        return _pika().BlockingConnection(self.connection_parameters(**overrides))

    def ping(self, timeout: float = 5.0) -> bool:
        """True when an AMQP connection (handshake and login) succeeds."""
        parts = urllib.parse.urlsplit(self._url)
        if parts.scheme == "amqp" and not _amqp_greets(
            parts.hostname or "localhost", self.amqp_port, timeout
        ):
            return False
        pika = _pika()
        try:
            conn = pika.BlockingConnection(
                self.connection_parameters(
                    connection_attempts=1,
                    retry_delay=0,
                    socket_timeout=timeout,
                    stack_timeout=timeout,
                    blocked_connection_timeout=timeout,
                )
            )
        except Exception:  # not answering yet, in whatever way: pika's
            # connection workflow raises its own errors too (AMQPConnectorStackTimeout
            # while a booting node accepts the socket but not yet the handshake)
            return False
        with contextlib.suppress(Exception):
            conn.close()
        return True

    def server_version(self) -> str:
        """The broker's version as it announces itself (connection.start), e.g. "4.3.6"."""
        conn = self.connect(connection_attempts=1, retry_delay=0, socket_timeout=10)
        try:
            value = (conn._impl.server_properties or {}).get("version", "")
        finally:
            with contextlib.suppress(Exception):
                conn.close()
        return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)

    def wait_until_up(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while not self.ping(timeout=5.0):
            if time.monotonic() > deadline:
                raise BrokerError(f"{self.masked_url} did not answer AMQP within {timeout:.0f}s")
            time.sleep(0.1)

    @contextlib.contextmanager
    def _channel(self) -> Iterator[Any]:
        conn = self.connect(
            connection_attempts=1, retry_delay=0, socket_timeout=10, stack_timeout=15
        )
        try:
            yield conn.channel()
        finally:
            with contextlib.suppress(Exception):
                conn.close()

    def purge(self, queue: str) -> int:
        """Remove all ready messages of ``queue``; returns how many were removed."""
        pika = _pika()
        try:
            with self._channel() as ch:
                ok = ch.queue_purge(queue)
        except pika.exceptions.ChannelClosedByBroker as exc:
            if exc.reply_code == 404:
                raise QueueNotFound(
                    f"queue {queue!r} does not exist (vhost {self.vhost!r})"
                ) from exc
            raise
        return int(ok.method.message_count)

    def delete(self, queue: str, *, if_unused: bool = False, if_empty: bool = False) -> None:
        """Delete ``queue`` (no error when it does not exist)."""
        self.delete_many([queue], if_unused=if_unused, if_empty=if_empty)

    def delete_many(
        self,
        queues: Sequence[str] = (),
        exchanges: Sequence[str] = (),
        *,
        if_unused: bool = False,
        if_empty: bool = False,
    ) -> None:
        """Delete several queues and exchanges over one connection."""
        if not queues and not exchanges:
            return
        pika = _pika()
        with self._channel() as ch:
            for name in queues:
                try:
                    ch.queue_delete(name, if_unused=if_unused, if_empty=if_empty)
                except pika.exceptions.ChannelClosedByBroker as exc:
                    if exc.reply_code != 404:
                        raise
                    ch = ch.connection.channel()
            for name in exchanges:
                if not name or name.startswith("amq."):
                    continue
                try:
                    ch.exchange_delete(name)
                except pika.exceptions.ChannelClosedByBroker as exc:
                    if exc.reply_code != 404:
                        raise
                    ch = ch.connection.channel()

    # -- counts -----------------------------------------------------------------

    def _erl_eval(self, expr: str) -> str | None:
        """Evaluate ``expr`` on the node (fast path); None when not available."""
        return None

    def counts(self, queue: str) -> QueueCounts:
        """Exact counts of ``queue`` right now (ready, unacked, total, consumers)."""
        out = self._erl_eval(_queue_counts_expr(self.vhost, queue))
        if out == "missing":
            raise QueueNotFound(f"queue {queue!r} does not exist (vhost {self.vhost!r})")
        if out is not None:
            counts = _read_queue_counts(out)
            if counts is not None:
                return counts
        table = self._ctl_counts()
        if queue not in table:
            raise QueueNotFound(f"queue {queue!r} does not exist (vhost {self.vhost!r})")
        return table[queue]

    def counts_all(self) -> dict[str, QueueCounts]:
        """Counts of every queue of the vhost."""
        fast = self._fast(_counts_all_expr(self.vhost), _read_counts_all)
        return fast if fast is not None else self._ctl_counts()

    def queue_names(self) -> list[str]:
        return sorted(self.counts_all())

    def exchange_names(self) -> list[str]:
        """Names of the exchanges of the vhost (including the default '' and amq.*)."""
        return sorted(self.exchange_types())

    def exchange_types(self) -> dict[str, str]:
        """The exchanges of the vhost by name, each with its type ("direct", "topic",
        "fanout", "headers", or a plugin's, e.g. "x-delayed-message"); the default
        exchange is ``""``."""
        fast = self._fast(_exchange_types_expr(self.vhost), _read_exchange_types)
        if fast is not None:
            return fast
        text = self.ctl(
            "list_exchanges", "-p", self.vhost, "--formatter", "json", "--quiet", "name", "type"
        )
        return {str(r["name"]): str(r["type"]) for r in _json_rows(text, "list_exchanges")}

    def bindings(self, queue: str) -> set[tuple[str, str]]:
        """``(exchange, routing key)`` of every binding of ``queue``, the default
        exchange's ``("", queue)`` included (empty when the queue does not exist)."""
        fast = self._fast(_bindings_expr(self.vhost, queue), _read_bindings)
        if fast is not None:
            return fast
        text = self.ctl(
            "list_bindings", "-p", self.vhost, "--formatter", "json", "--quiet",
            "source_name", "destination_name", "destination_kind", "routing_key",
        )  # fmt: skip
        return {
            (str(r["source_name"]), str(r["routing_key"]))
            for r in _json_rows(text, "list_bindings")
            if r["destination_name"] == queue and r["destination_kind"] == "queue"
        }

    def declared(self, queue: str) -> DeclaredQueue | None:
        """``queue`` as the node holds it: ``.type`` ("classic", "quorum", "stream") and
        ``.arguments`` (what it was declared with); None when there is no such queue."""
        out = self._erl_eval(_declared_expr(self.vhost, queue))
        if out is not None:
            try:
                return _read_declared(out)
            except (ValueError, TypeError):
                log.debug("erl_call answer not understood: %r", out[:300])
        text = self.ctl(
            "list_queues", "-p", self.vhost, "--formatter", "json", "--quiet",
            "name", "type", "arguments",
        )  # fmt: skip
        return _read_declared_json(text, queue)

    def eval_erlang(self, expr: str) -> str:
        """The value of the Erlang expression ``expr`` evaluated on the node, as ``~0p``
        prints it (``rabbitmqctl eval`` prints it as ``~p``): through erl_call on nodes
        of the kit's own (milliseconds), else ``rabbitmqctl eval`` (an Erlang VM of its
        own, a second or more)."""
        body = expr.strip().removesuffix(".")
        out = self._erl_eval(f'lists:flatten(["OK;", io_lib:format("~0p", [begin {body} end])]).')
        if out is not None:  # erl_call prints the answer as an Erlang string: unescape it
            return re.sub(r"\\(.)", lambda m: _ESCAPES.get(m[1], m[1]), out)
        return self.ctl("eval", body + ".").strip()

    def _fast(self, expr: str, read: Callable[[str], _R]) -> _R | None:
        """``read`` of the node's answer to ``expr`` through erl_call; None when there is
        no answer (not a node of the kit's own) or it is not understood."""
        out = self._erl_eval(expr)
        if out is None:
            return None
        try:
            return read(out)
        except (ValueError, TypeError):
            log.debug("erl_call answer not understood: %r", out[:300])
            return None

    def _ctl_counts(self) -> dict[str, QueueCounts]:
        return _parse_list_queues_json(self.ctl(*ctl_list_queues(self.vhost)))

    def wait_for(
        self,
        queue: str,
        *,
        ready: int | None = None,
        unacked: int | None = None,
        total: int | None = None,
        consumers: int | None = None,
        timeout: float = 10.0,
        interval: float = 0.05,
    ) -> QueueCounts:
        """Poll ``counts(queue)`` until the given fields match; AssertionError on timeout.

        Acks and publishes reach the queue asynchronously, so a test should wait
        for the expected state rather than read counts once.
        """
        want = wanted_counts(ready, unacked, total, consumers)
        deadline = time.monotonic() + timeout
        last: QueueCounts | str = "no answer yet"
        with self._watch() as pause:
            while True:
                try:
                    last = self.counts(queue)
                    if counts_reached(last, want):
                        return last
                except QueueNotFound as exc:
                    last = str(exc)
                left = deadline - time.monotonic()
                if left <= 0:
                    raise counts_not_reached(queue, want, timeout, last)
                pause(min(left, interval))

    @contextlib.contextmanager
    def _watch(self) -> Iterator[Callable[[float], object]]:
        """How `wait_for` waits between two looks at the counts: it calls what this
        yields with the most seconds to wait (a real broker's: sleep that long)."""
        yield time.sleep

    # -- control ----------------------------------------------------------------

    def ctl(self, *args: str, timeout: float = 60.0) -> str:
        """Run ``rabbitmqctl <args>`` against this broker's node; returns stdout."""
        raise BrokerError(f"rabbitmqctl is not available for {self!r}")

    def close_connections(self, reason: str = "closed by the ackkit test kit") -> None:
        """Force-close every client connection of the node (or vhost for AMQP_URL brokers)."""
        if self._erl_eval(_close_all_expr(reason)) is None:
            self.ctl("close_all_connections", "--global", reason)

    def close_connections_named(
        self, name: str, reason: str = "closed by the ackkit test kit"
    ) -> int:
        """Force-close (CONNECTION_FORCED) the client connections named ``name`` (an app's
        ``connection_name``): only that app loses its connection, even on a shared broker;
        returns how many."""
        out = self._erl_eval(_close_named_expr(name, reason))
        if out is not None and out.isdigit():
            return int(out)
        listing = self.ctl("list_connections", "-p", self.vhost, "pid", "client_properties", "-q")
        mine = f'{{"connection_name","{name}"}}'
        pids = [
            ln.split("\t", 1)[0] for ln in listing.splitlines() if ln.startswith("<") and mine in ln
        ]
        for pid in pids:
            self.ctl("close_connection", pid, reason)
        return len(pids)

    def _not_owned(self, op: str) -> BrokerNotOwned:
        return BrokerNotOwned(
            f"{op}() needs a broker node the test kit started itself (own=True); {self!r} is "
            f"an external broker. Use the own_rabbitmq fixture, or unset {ENV_URL} so the kit "
            "provisions its own node."
        )

    def restart(self) -> None:
        """Stop and start the node; returns once AMQP answers again."""
        raise self._not_owned("restart")

    def stop(self) -> None:
        raise self._not_owned("stop")

    def start(self) -> None:
        raise self._not_owned("start")

    def kill(self, *, flush_metadata: bool = True) -> None:
        """Kill the node without a clean shutdown (SIGKILL); ``start()`` brings it back.

        RabbitMQ 3.x writes queue/exchange declarations to Mnesia's transaction
        log asynchronously: a SIGKILL soon after ``queue.declare-ok`` can lose the
        queue (seen in about 1 of 5 kills under disk load). With ``flush_metadata``
        (the default) the log is synced first (``mnesia:sync_log()``), so a test
        sees a crash of the message path with the topology intact; messages get
        no such help (only confirmed persistent ones survive). Pass
        ``flush_metadata=False`` for a crash with nothing flushed.
        """
        raise self._not_owned("kill")

    def _sync_metadata(self) -> None:
        # (4.x with Khepri commits metadata through Raft before declare-ok; the
        # call then fails harmlessly inside the catch)
        if self._erl_eval('_ = (catch mnesia:sync_log()), "OK;".') is None:
            with contextlib.suppress(BrokerError):
                self.ctl("eval", "mnesia:sync_log().")

    def is_running(self) -> bool:
        return self.ping()

    @property
    def amqps_url(self) -> str | None:
        """``amqps://`` URL of a TLS listener (``provision_broker(tls=...)``), else None."""
        return None

    def log_text(self) -> str | None:
        """The broker's own log so far (to scan it for errors); None when not reachable."""
        return None
