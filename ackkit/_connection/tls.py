"""TLS for amqps:// connections: one value for both runtimes (pika and aio-pika).

Certificate verification is always on: the broker's certificate must chain to
`ca_file` / `ca_data` (the system's trust store when both are None) and name the
host (`server_hostname`, by default the URL's host). There is no switch to turn it
off; a private CA is what `ca_file` is for.
"""

from __future__ import annotations

import re
import socket
import ssl
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from .url import mask_url


class _Context(ssl.SSLContext):
    """A client context that checks the broker's certificate against `expected_hostname`
    (when set) whatever host the socket was opened to: aio-pika has no way to pass a
    server_hostname of its own, pika has one; this works the same for both."""

    expected_hostname: str | None = None

    def wrap_socket(
        self,
        sock: socket.socket,
        server_side: bool = False,
        do_handshake_on_connect: bool = True,
        suppress_ragged_eofs: bool = True,
        server_hostname: str | bytes | None = None,
        session: ssl.SSLSession | None = None,
    ) -> ssl.SSLSocket:
        name = self.expected_hostname or server_hostname
        return super().wrap_socket(
            sock, server_side, do_handshake_on_connect, suppress_ragged_eofs, name, session
        )

    def wrap_bio(
        self,
        incoming: ssl.MemoryBIO,
        outgoing: ssl.MemoryBIO,
        server_side: bool = False,
        server_hostname: str | bytes | None = None,
        session: ssl.SSLSession | None = None,
    ) -> Any:
        name = self.expected_hostname or server_hostname
        return super().wrap_bio(incoming, outgoing, server_side, name, session)


@dataclass(frozen=True, slots=True)
class TLS:
    """TLS settings for an `amqps://` URL.

    ```
    App("amqps://app:secret@mq.example.com/%2f",
        tls=TLS(ca_file="ca.pem", cert_file="client.pem", key_file="client.key"))
    ```

    `ca_file` / `ca_data` (PEM): the CAs that may sign the broker's certificate,
    else the system's trust store. `cert_file` / `key_file`: a client certificate
    (and its key, if not in `cert_file`) for brokers that ask for one;
    `key_password` unlocks an encrypted key. `server_hostname`: the name the
    broker's certificate must carry (and SNI), when it is not the URL's host.
    An `ssl.SSLContext` of your own may be passed instead of a TLS value.
    """

    ca_file: str | None = None
    ca_data: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    key_password: str | None = field(default=None, repr=False)
    server_hostname: str | None = None

    def __post_init__(self) -> None:
        if self.key_file and not self.cert_file:
            raise ValueError("TLS(key_file=...) needs cert_file= (the client certificate)")

    def context(self) -> ssl.SSLContext:
        """A client context: TLS 1.2+, the broker's certificate and host name verified."""
        ctx = _Context(ssl.PROTOCOL_TLS_CLIENT)  # CERT_REQUIRED and check_hostname
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.expected_hostname = self.server_hostname
        try:
            if self.ca_file or self.ca_data:
                ctx.load_verify_locations(cafile=self.ca_file, cadata=self.ca_data)
            else:
                ctx.load_default_certs(ssl.Purpose.SERVER_AUTH)
            if self.cert_file:
                ctx.load_cert_chain(self.cert_file, self.key_file, password=self.key_password)
        except (OSError, ssl.SSLError) as exc:
            raise ValueError(f"TLS files could not be loaded: {exc}") from None
        return ctx


def client_tls(
    url: str, tls: TLS | ssl.SSLContext | None
) -> tuple[ssl.SSLContext, str | None] | None:
    """(context, server_hostname) for `url`, or None for a plain amqp:// URL.

    amqps:// without `tls` verifies against the system's trust store; `tls` with an
    amqp:// URL is refused (the port would be the plaintext one).
    """
    scheme = urllib.parse.urlsplit(url).scheme.lower()
    if scheme != "amqps":
        if tls is not None:
            raise ValueError(
                f"tls= was given but {mask_url(url)} is not an amqps:// URL; use amqps://"
            )
        return None
    if isinstance(tls, ssl.SSLContext):
        return tls, urllib.parse.urlsplit(url).hostname
    tls = tls or TLS()
    return tls.context(), tls.server_hostname or urllib.parse.urlsplit(url).hostname


# OpenSSL reasons of a handshake the broker refused because of our certificate.
_REFUSED = {
    "TLSV13_ALERT_CERTIFICATE_REQUIRED": "the broker requires a client certificate",
    "SSLV3_ALERT_BAD_CERTIFICATE": "the broker rejected the client certificate",
    "SSLV3_ALERT_CERTIFICATE_UNKNOWN": "the broker rejected the client certificate",
    "TLSV1_ALERT_UNKNOWN_CA": "the broker does not trust the client certificate's CA",
    "SSLV3_ALERT_CERTIFICATE_EXPIRED": "the broker rejected the expired client certificate",
}


def tls_failure(exc: BaseException, url: str) -> str | None:
    """A clear message when `exc` (anywhere in its chain) is a TLS certificate failure
    that retrying cannot fix, else None."""
    for e in _chain(exc, set()):
        if isinstance(e, ssl.SSLCertVerificationError):
            return _not_accepted(url, e.verify_message or _SSL_SUFFIX.sub("", str(e)))
        reason = e.reason if isinstance(e, ssl.SSLError) else None
        # pika also wraps the SSL error into a message string (StreamLostError)
        text = str(e)
        for key, what in _REFUSED.items():
            if reason == key or key in text:
                return f"TLS: {what} ({mask_url(url)}: {key})"
        if "CERTIFICATE_VERIFY_FAILED" in text:
            why = _SSL_SUFFIX.sub("", text.split("certificate verify failed:")[-1])
            return _not_accepted(url, why.strip(" )'\""))
    return None


def handshake_hint(exc: BaseException, url: str) -> str:
    """For amqps://, a hint to add to a connect error when the broker cut the TLS
    handshake short: that is what one that wants a client certificate may do."""
    if urllib.parse.urlsplit(url).scheme.lower() != "amqps":
        return ""
    text = " ".join(str(e) for e in _chain(exc, set())).lower()
    if "reset" in text or "eof" in text:
        return (
            " (a broker that requires a client certificate cuts the TLS handshake short: "
            "TLS(cert_file=..., key_file=...))"
        )
    return ""


_SSL_SUFFIX = re.compile(r"\s*\(_ssl\.c:\d+\)")


def _not_accepted(url: str, why: str) -> str:
    return (
        f"TLS: the certificate of {mask_url(url)} was not accepted ({why}); check "
        "TLS(ca_file=...) and that the certificate names the host (or TLS(server_hostname=...))"
    )


def _chain(exc: BaseException, seen: set[int]) -> Iterator[BaseException]:
    """`exc` and every exception it wraps (cause, context, args, pika's `exceptions`)."""
    if id(exc) in seen:
        return
    seen.add(id(exc))
    yield exc
    inner: list[object] = [exc.__cause__, exc.__context__, *exc.args]
    inner += list(getattr(exc, "exceptions", None) or [])
    inner.append(getattr(exc, "exception", None))
    for x in inner:
        if isinstance(x, BaseException):
            yield from _chain(x, seen)
