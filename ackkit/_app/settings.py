"""An app's connection and shutdown settings: one frozen, checked value.

`App` and `AsyncApp` check their keyword options into a `Settings` at
construction (a wrong one fails there, with its name), and each run hands the
value to its runtime: the runtime reads nothing of the app.
"""

from __future__ import annotations

import dataclasses
import ssl
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar, overload

from .._connection import addresses
from .._connection.tls import TLS, client_tls
from .._connection.url import check_url, mask_url
from .._core import checks as C

DEFAULT_URL = "amqp://guest:guest@127.0.0.1:5672/%2f"
AMQP091 = "amqp0-9-1"
AMQP10 = "amqp1.0"
PROTOCOLS = (AMQP091, AMQP10)
"""The protocols an App speaks to RabbitMQ (`protocol=`)."""
_DAY = 86_400.0
T = TypeVar("T")


@dataclass(frozen=True)
class Settings:
    """How an app connects, how long it waits, and how it shuts down.

    Build it with `Settings.check(...)`, which validates every field; the
    constructor itself trusts its arguments.
    """

    url: str = DEFAULT_URL
    """The first node's URL (the only one for a single-node broker)."""
    urls: tuple[str, ...] = (DEFAULT_URL,)
    """Every node's URL, in the order they are tried (`ackkit._connection.addresses`)."""
    heartbeat: int = 30
    shutdown_timeout: float = 30.0
    reconnect_max_interval: float = 15.0
    startup_timeout: float = 60.0
    connection_name: str = "ackkit"
    tls_option: TLS | ssl.SSLContext | None = None
    """The `tls=` option as given (kept to rebuild `tls` for another URL)."""
    tls: tuple[ssl.SSLContext, str | None] | None = None
    """(context, server name) for an amqps:// URL, None for amqp://."""
    protocol: str = AMQP091
    """"amqp0-9-1" (pika) or "amqp1.0" (python-qpid-proton; RabbitMQ 4.0+)."""

    @property
    def safe_url(self) -> str:
        """The URL (every node's, for several) with its password masked, for logs and
        errors."""
        return addresses.describe(self.urls) if len(self.urls) > 1 else mask_url(self.url)

    def tls_for(self, url: str) -> tuple[ssl.SSLContext, str | None] | None:
        """(context, server name) for one of `urls`: the app's context, and the name
        `TLS(server_hostname=...)` gives, else that node's host."""
        if self.tls is None or url == self.url:
            return self.tls
        named = self.tls_option.server_hostname if isinstance(self.tls_option, TLS) else None
        return self.tls[0], named or urllib.parse.urlsplit(url).hostname

    @classmethod
    def check(
        cls,
        url: str | Sequence[str] = DEFAULT_URL,
        *,
        heartbeat: int = 30,
        shutdown_timeout: float = 30.0,
        reconnect_max_interval: float = 15.0,
        startup_timeout: float = 60.0,
        connection_name: str = "ackkit",
        tls: TLS | ssl.SSLContext | None = None,
        protocol: str = AMQP091,
    ) -> Settings:
        """The settings, each checked: ValueError/TypeError naming the bad option.

        `url`: one URL, the comma form (``amqp://u:p@h1:5672,h2:5673/v``) or a list of
        URLs, one per node (`ackkit._connection.addresses`)."""
        urls = addresses.parse(url)
        url = check_url(urls[0])
        if tls is not None and not isinstance(tls, (TLS, ssl.SSLContext)):
            raise TypeError(f"tls must be an ackkit.TLS, an ssl.SSLContext or None, got {tls!r}")
        if protocol not in PROTOCOLS:
            raise ValueError(f"protocol must be one of {PROTOCOLS}, got {protocol!r}")
        if protocol == AMQP10:
            try:
                import proton  # noqa: F401
            except ImportError:
                raise ValueError(
                    "protocol='amqp1.0' needs python-qpid-proton: pip install 'ackkit[amqp10]'"
                ) from None
            for u in urls:
                scheme = u.split(":", 1)[0].lower()
                if scheme != "amqp":
                    raise ValueError(
                        f"protocol='amqp1.0' connects to amqp:// URLs only (no TLS and no "
                        f"in-memory broker over AMQP 1.0 yet), got a {scheme}: URL"
                    )
        return cls(
            url=url,
            urls=urls,
            # AMQP's heartbeat is an unsigned short (0: off)
            heartbeat=C.integer("heartbeat", heartbeat, 0, C.MAX_SHORT),
            shutdown_timeout=C.number("shutdown_timeout", shutdown_timeout, 0, _DAY),
            reconnect_max_interval=C.number(
                "reconnect_max_interval", reconnect_max_interval, 0, _DAY, above=True
            ),
            startup_timeout=C.number("startup_timeout", startup_timeout, 0, _DAY, above=True),
            connection_name=C.text("connection_name", connection_name, empty=True),
            tls_option=tls,
            # amqps:// URLs: the files load here, so a bad path or an amqp:// URL with
            # tls= fails at construction, not at the first connect.
            tls=client_tls(url, tls),
            protocol=protocol,
        )

    def replace(self, **changes: object) -> Settings:
        """These settings with `changes` (options by name), all checked again."""
        opts: dict[str, object] = {
            "url": self.urls if len(self.urls) > 1 else self.url,
            "heartbeat": self.heartbeat,
            "shutdown_timeout": self.shutdown_timeout,
            "reconnect_max_interval": self.reconnect_max_interval,
            "startup_timeout": self.startup_timeout,
            "connection_name": self.connection_name,
            "tls": self.tls_option,
            "protocol": self.protocol,
        }
        unknown = set(changes) - set(opts)
        if unknown:
            raise TypeError(f"no such app option: {', '.join(sorted(unknown))}")
        opts.update(changes)
        url = opts.pop("url")
        if isinstance(url, str) and url.lower().startswith("memory:"):
            # the test kit's in-memory broker: the TLS option stays for the next URL
            checked = Settings.check(url, **{**opts, "tls": None})  # type: ignore[arg-type]
            return dataclasses.replace(checked, tls_option=self.tls_option)
        return Settings.check(url, **opts)  # type: ignore[arg-type]


class _Option(Generic[T]):
    """One app option as an attribute of `SettingsView`: read from the app's `Settings`,
    and set by a new `Settings` with it replaced (checked again, used from the next
    start)."""

    def __init__(self, doc: str) -> None:
        self.__doc__ = doc
        self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, view: None, owner: type) -> _Option[T]: ...

    @overload
    def __get__(self, view: SettingsView, owner: type) -> T: ...

    def __get__(self, view: SettingsView | None, owner: type) -> T | _Option[T]:
        if view is None:
            return self
        value: T = getattr(view.settings, self.name)
        return value

    def __set__(self, view: SettingsView, value: T) -> None:
        view.settings = view.settings.replace(**{self.name: value})


class SettingsView:
    """An app's settings as attributes: each one checked again when set (a new frozen
    `Settings`, used from the next start)."""

    settings: Settings

    @property
    def url(self) -> str:
        """The broker URL (with its password; log `safe_url`)."""
        return self.settings.url

    @url.setter
    def url(self, url: str | Sequence[str]) -> None:
        """Point the app at another broker (checked now; used from the next start)."""
        self.settings = self.settings.replace(url=url)

    @property
    def urls(self) -> tuple[str, ...]:
        """Every node's URL, in the order they are tried (one for a single node)."""
        return self.settings.urls

    @property
    def safe_url(self) -> str:
        """The broker URL with its password masked, for logs."""
        return self.settings.safe_url

    heartbeat: _Option[int] = _Option("AMQP heartbeat in seconds (0: off).")
    shutdown_timeout: _Option[float] = _Option(
        "Seconds a graceful stop waits for running handlers."
    )
    reconnect_max_interval: _Option[float] = _Option(
        "The longest wait between reconnect attempts, in seconds."
    )
    startup_timeout: _Option[float] = _Option(
        "Seconds `start()` / `run()` waits for a first connection."
    )
    connection_name: _Option[str] = _Option("The name the broker shows for the app's connection.")
    protocol: _Option[str] = _Option(
        'The protocol spoken to the broker: "amqp0-9-1" (pika) or "amqp1.0" (RabbitMQ 4.0+).'
    )

    @property
    def tls(self) -> tuple[ssl.SSLContext, str | None] | None:
        """The TLS context and server name for an amqps:// URL; None without TLS."""
        return self.settings.tls
