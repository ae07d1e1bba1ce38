"""What the cluster tests ask a node about the clients' connections."""

from __future__ import annotations

import json

from ackkit.testing import BrokerError
from ackkit_testkit import ClusterHandle


def _binary(text: str) -> str:
    return "<<" + ",".join(str(b) for b in text.encode("utf-8")) + ">>"


def _ports_expr(name: str) -> str:
    """The server ports of the connections named `name` in the whole cluster:
    "OK;<port>,<port>,..." (erl_call)."""
    return (
        f"N = {_binary(name)}, Named = fun(P) -> case catch "
        "rabbit_networking:connection_info(P, [client_properties]) of "
        "[{client_properties, Props}] when is_list(Props) -> "
        'lists:member({<<"connection_name">>, longstr, N}, Props); _ -> false end end, '
        "Ports = [case catch rabbit_networking:connection_info(P, [port]) of "
        "[{port, Port}] when is_integer(Port) -> integer_to_list(Port); _ -> [] end "
        "|| P <- rabbit_networking:connections(), Named(P)], "
        'lists:flatten(["OK;", lists:join(",", [X || X <- Ports, X =/= []])]).'
    )


def connection_ports(cluster: ClusterHandle, name: str, via: int) -> list[int] | str:
    """The server ports of the connections named `name`, as node `via` lists them (every
    node's connections); the error's text when a node just killed fails the listing.
    Asked through erl_call (milliseconds), else ``rabbitmqctl list_connections``."""
    node = cluster[via]
    out = node._erl_eval(_ports_expr(name))
    if out is not None:
        return [int(p) for p in out.split(",") if p]
    try:
        text = node.ctl(
            "list_connections", "client_properties", "port", "--formatter", "json", "--quiet"
        )
    except BrokerError as exc:
        return str(exc)[:300]
    rows = json.loads(text or "[]")  # the client properties' shape differs across versions
    return [r["port"] for r in rows if f'"{name}"' in json.dumps(r["client_properties"])]
