"""A broker user of the tests' own, with the permissions a test gives it: made and
removed by the node's own functions (the handle's eval_erlang: erl_call on nodes of the
kit's own, milliseconds; rabbitmqctl eval elsewhere)."""

from __future__ import annotations

import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


def _binary(text: str) -> str:
    return "<<" + ",".join(str(b) for b in text.encode("utf-8")) + ">>"


def _on_node(handle: Any, expr: str) -> None:
    """``expr`` (an Erlang call answering ok) on the node (the handle's eval_erlang);
    RuntimeError with the node's answer when it is not ok."""
    out = handle.eval_erlang(expr)
    if out != "ok":
        raise RuntimeError(f"the node refused {expr.split('(')[0]}: {out}")


@contextmanager
def user(
    handle: Any, name: str, password: str, configure: str, write: str, read: str
) -> Iterator[str]:
    """A user ``name`` on ``handle``'s vhost with these permissions (regular
    expressions); yields the broker URL with its credentials, and deletes the user."""
    internal = "rabbit_auth_backend_internal"
    u, by = _binary(name), _binary("ackkit-tests")
    _on_node(handle, f"{internal}:add_user({u}, {_binary(password)}, {by})")
    try:
        vhost = _binary(handle.vhost)
        perms = ", ".join(_binary(p) for p in (configure, write, read))
        _on_node(handle, f"{internal}:set_permissions({u}, {vhost}, {perms}, {by})")
        p = urllib.parse.urlsplit(handle.url)
        netloc = f"{urllib.parse.quote(name)}:{urllib.parse.quote(password)}@{p.hostname}:{p.port}"
        yield urllib.parse.urlunsplit(p._replace(netloc=netloc))
    finally:
        _on_node(handle, f"{internal}:delete_user({u}, {by})")
