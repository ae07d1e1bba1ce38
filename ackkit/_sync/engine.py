"""The life of a pika SelectConnection on an I/O thread of its own.

Shared by the App's runtime and the Spark source's consumer: declare the
topology on a short blocking connection, open a `FaithfulConnection`, run its
I/O loop until the connection ends, reconnect with tenacity's backoff (`ackkit._connection.io`),
tick the listeners periodically, and let other threads hand work to the I/O
thread (`call_soon`), the only thread that may touch pika. What happens on the
connection (channels, consumers, the publisher) is the subclass's, through
the hooks at the bottom.
"""

from __future__ import annotations

import contextlib
import logging
import ssl
import threading
from collections.abc import Callable, Sequence
from typing import Any

import pika
import pika.exceptions
from tenacity import Retrying, retry_if_exception

from .._connection.addresses import Rotation
from .._connection.io import TICK, ConnectFailed, FatalConnectError, reconnect_policy
from .._connection.tls import handshake_hint, tls_failure
from .._connection.url import mask_text, mask_url
from .._core.errors import TopologyConflict
from .._telemetry.logs import log_attempt
from ._pika import blocking_connection, select_connection

log = logging.getLogger("ackkit")


class Engine:
    """Connects, serves one connection at a time and reconnects until `stopping`."""

    tick_interval = TICK
    """Seconds between calls of `tick()` while the connection is open."""

    def __init__(
        self, url: str, safe_url: str, max_interval: float, urls: Sequence[str] = ()
    ) -> None:
        self.url = url
        """The address the current (or latest) connection attempt uses."""
        self.safe_url = safe_url
        # Several node addresses: each attempt after a failed one or a lost connection
        # uses the next (`ackkit._connection.addresses`).
        self.rotation = Rotation(urls or (url,))
        self.max_interval = max_interval
        self.connection: Any = None
        self.stopping = False
        self.fatal: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._opened = False
        self._close_reason = ""
        self._loop_closed = threading.Event()
        self._loop_closed.set()
        self._stop_requested = threading.Event()  # cuts a reconnect backoff short

    def _backoff(self, seconds: float) -> None:
        self._stop_requested.wait(seconds)

    def request_stop(self) -> None:
        """From now on no new connection is tried; a backoff in progress ends at once."""
        self.stopping = True
        self._stop_requested.set()

    def start_io(self, name: str) -> None:
        self._thread = threading.Thread(target=self._io_main, name=name, daemon=True)
        self._thread.start()

    def call_soon(self, fn: Callable[[], None]) -> bool:
        """Run `fn` on the I/O thread; False if there is no running I/O loop to take it."""
        conn = self.connection
        if conn is None or self._loop_closed.is_set():
            return False
        try:
            conn.ioloop.add_callback_threadsafe(fn)
        except Exception:  # its loop is closed: the broker requeues what was unsettled
            log.debug("I/O loop closed; dropped a callback", exc_info=True)
            return False
        return True

    # -- I/O thread ------------------------------------------------------------

    def _io_main(self) -> None:
        try:
            while not self.stopping:
                retry = retry_if_exception(self.retryable)
                policy = reconnect_policy(self.max_interval, retry, lambda: self.safe_url)
                retrying = Retrying(**policy, sleep=self._backoff)
                for attempt in retrying:
                    with attempt:
                        if self.stopping:
                            return
                        self._serve()
        except (FatalConnectError, TopologyConflict) as exc:
            self.refused(exc)
        except BaseException as exc:
            self.crashed(exc)
        finally:
            self.finished()

    def _serve(self) -> None:
        """One connection's life, to the rotation's current address (the next one
        after it ends). Raises ConnectFailed if it never opened."""
        several = len(self.rotation.urls) > 1
        if several:
            self.url = self.rotation.current
            self.safe_url = mask_url(self.url)
        log_attempt(self.safe_url, self.rotation.index, len(self.rotation.urls))
        try:
            self._serve_one()
        finally:
            if several:
                self.rotation.advance()

    def _serve_one(self) -> None:
        params = self.parameters()
        self._topology(params)
        self._opened = False
        self._loop_closed.clear()
        conn = select_connection(
            params,
            on_open_callback=self._on_open,
            on_open_error_callback=self._on_open_error,
            on_close_callback=self._on_close,
        )
        self.connection = conn
        try:
            conn.ioloop.start()
        finally:
            self._loop_closed.set()
            with contextlib.suppress(Exception):
                conn.ioloop.close()
        if not self._opened:
            raise ConnectFailed(self._close_reason)
        if not self.stopping:
            log.warning(
                "connection to %s lost (%s); reconnecting",
                self.safe_url,
                self._close_reason,
            )

    def _topology(self, params: Any) -> None:
        try:
            conn = blocking_connection(params)
        except pika.exceptions.ProbableAuthenticationError as exc:
            raise FatalConnectError(f"authentication failed for {self.safe_url}: {exc}") from None
        except pika.exceptions.ProbableAccessDeniedError as exc:
            raise FatalConnectError(f"access denied on {self.safe_url}: {exc}") from None
        except (pika.exceptions.AMQPConnectionError, ssl.SSLError) as exc:
            bad_tls = tls_failure(exc, self.url)
            if bad_tls is not None:
                raise FatalConnectError(bad_tls) from None
            raise ConnectFailed(mask_text(repr(exc)) + handshake_hint(exc, self.url)) from None
        except (OSError, ValueError) as exc:
            # pika's own connect workflow can raise these when the socket dies half-way
            # (seen during a broker restart: "Expected connected socket, but getpeername()
            # failed"): a failed attempt like any other, not a reason to stop the app.
            raise ConnectFailed(mask_text(repr(exc))) from None
        try:
            self.declare(conn)
        except pika.exceptions.AMQPError as exc:
            raise ConnectFailed(mask_text(repr(exc))) from None
        finally:
            if conn.is_open:
                conn.close()

    def _on_open(self, conn: Any) -> None:
        self._opened = True
        self.opened(conn)
        conn.ioloop.call_later(self.tick_interval, self._tick)

    def _on_open_error(self, conn: Any, err: BaseException) -> None:
        self._close_reason = mask_text(repr(err))
        conn.ioloop.stop()

    def _on_close(self, conn: Any, reason: BaseException) -> None:
        self._close_reason = mask_text(repr(reason))
        self.closed(reason)
        conn.ioloop.stop()

    def _tick(self) -> None:
        conn = self.connection
        if conn is None or not conn.is_open:
            return
        self.tick()
        if conn.is_open:
            conn.ioloop.call_later(self.tick_interval, self._tick)

    # -- hooks -------------------------------------------------------------------

    def parameters(self) -> Any:
        """The pika connection parameters (asked before every connection)."""
        raise NotImplementedError

    def declare(self, conn: pika.BlockingConnection) -> None:
        """Declare or check the topology on a blocking connection, before consuming."""

    def opened(self, conn: Any) -> None:
        """The connection is open (I/O thread): open the channels."""

    def closed(self, reason: BaseException) -> None:
        """The connection closed (I/O thread): every channel on it is gone."""

    def channels_lost(self, reason: BaseException) -> None:
        """Every listener channel is gone (the connection is closing)."""

    def tick(self) -> None:
        """Periodic work on the I/O thread (time-based ack flushing)."""

    def retryable(self, exc: BaseException) -> bool:
        """Is a connection attempt that raised `exc` tried again (with backoff)?"""
        return isinstance(exc, ConnectFailed)

    def refused(self, exc: FatalConnectError | TopologyConflict) -> None:
        """Connecting failed in a way retrying cannot fix."""
        self.fatal = exc

    def crashed(self, exc: BaseException) -> None:
        """The I/O thread failed otherwise (a bug of ours)."""
        self.fatal = exc

    def finished(self) -> None:
        """The I/O thread ends (stopped, or failed)."""
