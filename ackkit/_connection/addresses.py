"""A broker's node addresses: what the user gave, as single-node URLs, and their order.

`App`, `AsyncApp` and pull connections take one URL, a list of URLs, or the comma
form other clients know (``amqp://user:pass@h1:5672,h2:5673/vhost?heartbeat=10``:
the hosts share the credentials, virtual host and query). `parse` turns any of them
into a tuple of single-node URLs, checked at once; `Rotation` says which one a
connection attempt uses: the first one first, then after every failed attempt or lost
connection the next one in the given order, wrapping around. No I/O here: the
runtimes carry the decisions out.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Sequence

from .url import check_url, mask_url


def parse(url: object) -> tuple[str, ...]:
    """The single-node URLs of `url` (a URL, a comma-form URL or a list of URLs), in
    the given order; ValueError / TypeError naming what is wrong (passwords masked).

    Every address of one app must reach the same virtual host as the same user over
    the same scheme: a failover that lands in another vhost would consume other
    queues, and TLS settings are the app's, not a node's."""
    if isinstance(url, str):
        urls = split(url)
    elif isinstance(url, Sequence) and not isinstance(url, (bytes, bytearray)):
        if not url:
            raise ValueError("url: the list of node addresses is empty")
        urls = ()
        for u in url:
            if not isinstance(u, str):
                raise TypeError(f"url: each node address must be a str, got {type(u).__name__}")
            urls += split(u)
    else:
        raise TypeError(f"url must be a str or a list of str, got {type(url).__name__}")
    if len(urls) > 1:
        _check_alike(urls)
    return urls


def split(url: str) -> tuple[str, ...]:
    """One URL per host of `url`: ``amqp://u:p@h1,h2:5673/v`` -> the URL of h1 and of
    h2:5673, each with ``u:p@``, ``/v`` and the query; a URL of one host as it is."""
    scheme, sep, rest = url.partition("://")
    end = len(rest)
    for stop in "/?#":
        at = rest.find(stop)
        if at != -1:
            end = min(end, at)
    netloc, tail = rest[:end], rest[end:]
    userinfo, at_sign, hosts = netloc.rpartition("@")
    if not sep or "," not in hosts:
        return (check_url(url),)
    out = []
    for host in hosts.split(","):
        one = f"{scheme}://{userinfo}{at_sign}{host}{tail}"
        if not host.strip():
            raise ValueError(f"url {mask_url(url)!r}: an empty host in its list of hosts")
        out.append(_checked_node(one))
    return tuple(out)


def _checked_node(url: str) -> str:
    """`url` checked as one node of several: it must name its host."""
    check_url(url)
    parts = urllib.parse.urlsplit(url)
    if not parts.hostname:
        raise ValueError(f"url {mask_url(url)!r} names no host")
    if parts.scheme.lower() == "memory":
        raise ValueError(f"url {mask_url(url)!r}: a memory:// broker cannot be one of several")
    return url


def vhost(url: str) -> str:
    """The virtual host `url` reaches (as pika reads it: no path, or "/", is "/")."""
    path = urllib.parse.urlsplit(url).path
    return urllib.parse.unquote(path[1:]) if len(path) > 1 else "/"


def _check_alike(urls: tuple[str, ...]) -> None:
    first = urllib.parse.urlsplit(_checked_node(urls[0]))
    seen = {(first.hostname, first.port)}
    for u in urls[1:]:
        parts = urllib.parse.urlsplit(_checked_node(u))
        what = None
        if parts.scheme.lower() != first.scheme.lower():
            what = "scheme"
        elif vhost(u) != vhost(urls[0]):
            what = "virtual host"
        elif parts.username != first.username:
            what = "user"
        if what is not None:
            raise ValueError(
                f"url: every node address must have the same {what}: "
                f"{mask_url(urls[0])!r} and {mask_url(u)!r} differ"
            )
        key = (parts.hostname, parts.port)
        if key in seen:
            raise ValueError(f"url: node address {mask_url(u)!r} is listed twice")
        seen.add(key)


def describe(urls: Sequence[str]) -> str:
    """The addresses for a log line or an error, passwords masked."""
    return ", ".join(mask_url(u) for u in urls)


class Rotation:
    """Which address the next connection attempt uses.

    The first one first; `advance()` after an attempt that failed or a connection that
    was lost moves to the next one in the given order, wrapping after the last."""

    __slots__ = ("_index", "urls")

    def __init__(self, urls: Sequence[str]) -> None:
        if not urls:
            raise ValueError("no node address to connect to")
        self.urls = tuple(urls)
        self._index = 0

    @property
    def current(self) -> str:
        """The address the next attempt connects to."""
        return self.urls[self._index]

    @property
    def index(self) -> int:
        return self._index

    def advance(self) -> str:
        """Move to the address after the current one (wrapping); returns it."""
        self._index = (self._index + 1) % len(self.urls)
        return self.current
