"""A broker user of the tests' own, with the permissions a test gives it: made and
removed through erl_call on nodes of the kit's own (milliseconds), rabbitmqctl elsewhere
(an Erlang VM's start per command)."""

from __future__ import annotations

import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


def _binary(text: str) -> str:
    return "<<" + ",".join(str(b) for b in text.encode("utf-8")) + ">>"


def _on_node(handle: Any, expr: str, *ctl: str) -> None:
    """``expr`` (an Erlang call answering ok) on the node, else ``rabbitmqctl <ctl>``;
    BrokerError (or RuntimeError) when the node refuses."""
    out = handle._erl_eval(
        f'R = ({expr}), lists:flatten(["OK;", case R of ok -> "ok"; '
        'E -> io_lib:format("~w", [E]) end]).'
    )
    if out is None:
        handle.ctl(*ctl)
    elif out != "ok":
        raise RuntimeError(f"the node refused {ctl[0]}: {out}")


@contextmanager
def user(
    handle: Any, name: str, password: str, configure: str, write: str, read: str
) -> Iterator[str]:
    """A user ``name`` on ``handle``'s vhost with these permissions (regular
    expressions); yields the broker URL with its credentials, and deletes the user."""
    internal = "rabbit_auth_backend_internal"
    u, by = _binary(name), _binary("ackkit-tests")
    _on_node(
        handle, f"{internal}:add_user({u}, {_binary(password)}, {by})", "add_user", name, password
    )
    try:
        vhost = _binary(handle.vhost)
        perms = ", ".join(_binary(p) for p in (configure, write, read))
        _on_node(
            handle,
            f"{internal}:set_permissions({u}, {vhost}, {perms}, {by})",
            "set_permissions", "-p", handle.vhost, name, configure, write, read,
        )  # fmt: skip
        p = urllib.parse.urlsplit(handle.url)
        netloc = f"{urllib.parse.quote(name)}:{urllib.parse.quote(password)}@{p.hostname}:{p.port}"
        yield urllib.parse.urlunsplit(p._replace(netloc=netloc))
    finally:
        _on_node(handle, f"{internal}:delete_user({u}, {by})", "delete_user", name)
