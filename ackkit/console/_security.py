"""Who may use the console: loopback or authentication, CSRF tokens, safe headers.

- Bound to a loopback address, the console may run without authentication
  (only this machine reaches it; the Host header must name a loopback host, which
  stops a DNS-rebinding page from reading it).
- Bound anywhere else it refuses to start without a token or basic auth.
- Every POST carries the page's CSRF token (and, when the browser sends one, an
  Origin of the console itself).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import ipaddress
import secrets
from dataclasses import dataclass, field

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
COOKIE = "ackkit_console"


def is_loopback(host: str) -> bool:
    h = host.strip("[]")
    if h == "localhost":
        return True
    try:
        return ipaddress.ip_address(h).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class Access:
    """The console's access rules (checked once, when it is built)."""

    host: str = "127.0.0.1"
    token: str | None = None
    basic: tuple[str, str] | None = None
    """(user, password) for HTTP basic auth."""
    read_only: bool = False
    allowed_hosts: tuple[str, ...] = ()
    """Host header values accepted (default: loopback names when bound to loopback,
    any when authentication is on)."""
    secret: bytes = field(default_factory=lambda: secrets.token_bytes(32), repr=False)

    def __post_init__(self) -> None:
        if self.token is not None and len(self.token) < 16:
            raise ValueError("--token must be at least 16 characters (e.g. `openssl rand -hex 16`)")
        if self.basic is not None:
            user, pw = self.basic
            if not user or ":" in user or len(pw) < 8:
                raise ValueError(
                    "--basic-auth must be USER:PASSWORD, a user without ':' and a password of "
                    "at least 8 characters"
                )
        if not is_loopback(self.host) and not self.authenticated:
            raise ValueError(
                f"the console refuses to listen on {self.host!r} (not a loopback address) "
                "without authentication: give --token or --basic-auth, or bind 127.0.0.1"
            )

    @property
    def authenticated(self) -> bool:
        return self.token is not None or self.basic is not None

    def hosts(self) -> list[str]:
        if self.allowed_hosts:
            return list(self.allowed_hosts)
        if self.authenticated and not is_loopback(self.host):
            return ["*"]
        return ["localhost", "127.0.0.1", "::1", "[::1]"]

    def csrf(self) -> str:
        return hmac.new(self.secret, b"csrf", hashlib.sha256).hexdigest()

    def session(self) -> str:
        """The cookie value a browser gets once it showed the token."""
        return hmac.new(self.secret, b"session", hashlib.sha256).hexdigest()

    def check_csrf(self, sent: str | None) -> bool:
        return sent is not None and hmac.compare_digest(sent.encode(), self.csrf().encode())

    def who(
        self, authorization: str | None, cookie: str | None, query_token: str | None
    ) -> str | None:
        """The name an authenticated request acts under, or None when it is not."""
        if not self.authenticated:
            return "local"
        if cookie is not None and hmac.compare_digest(cookie.encode(), self.session().encode()):
            return "token"
        if self.token is not None and query_token is not None and _same(query_token, self.token):
            return "token"
        if authorization:
            scheme, _, cred = authorization.partition(" ")
            if scheme.lower() == "bearer" and self.token is not None and _same(cred, self.token):
                return "token"
            if scheme.lower() == "basic" and self.basic is not None:
                try:
                    user, _, pw = base64.b64decode(cred.strip()).decode("utf-8").partition(":")
                except (binascii.Error, UnicodeDecodeError):
                    return None
                ok_user = hmac.compare_digest(user.encode(), self.basic[0].encode())
                ok_pw = hmac.compare_digest(pw.encode(), self.basic[1].encode())
                if ok_user and ok_pw:
                    return user
        return None


def _same(sent: str, expected: str) -> bool:
    return hmac.compare_digest(sent.strip().encode(), expected.encode())


SECURITY_HEADERS = {
    "content-security-policy": "default-src 'none'; style-src 'unsafe-inline'; img-src 'self' "
    "data:; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    "x-frame-options": "DENY",
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "cache-control": "no-store",
}
"""No script runs on the console's pages at all, and no other site may frame them."""
