"""A throwaway RabbitMQ node of the kit's own, of the version asked for.

3.10 (the default) is the machine's ``rabbitmq-server`` (:mod:`._provider_node`);
4.0 and 4.3 run in a Debian root (:mod:`._provider_chroot`, :mod:`._rootfs`).
Nodes that dead test runs left behind are reaped once per process and data
directory parent, before the first node of the kit's own boots there (a test
empties ``_reaped`` to reap again).
"""

from __future__ import annotations

import threading

from ackkit.testing import BrokerHandle, BrokerUnavailable, NodeTLS
from ackkit.testing.providers import DEFAULT_VERSION, HOW_TO_GET_A_BROKER

from ._node_os import _find_rabbitmq_server, _reap_dead_runs
from ._provider_chroot import _ChrootNode
from ._provider_node import _OwnNode

__all__ = ["find_rabbitmq_server", "own_node"]

_reaped: set[str] = set()
_reap_lock = threading.Lock()


def _reap_orphans(parent: str) -> None:
    """Kill nodes (and remove data directories) left behind by dead test runs; once."""
    with _reap_lock:
        if parent in _reaped:
            return
        _reaped.add(parent)
    _reap_dead_runs(parent)


def find_rabbitmq_server() -> str | None:
    """Path of the machine's real ``rabbitmq-server`` script (``ACKKIT_RABBITMQ_SERVER``
    when set), None when RabbitMQ is not installed."""
    return _find_rabbitmq_server()


def own_node(
    version: str = DEFAULT_VERSION,
    *,
    server: str | None = None,
    tls: NodeTLS | None = None,
    streams: bool = False,
) -> BrokerHandle:
    """Boot a throwaway node of RabbitMQ ``version`` ("3.10": the machine's
    ``rabbitmq-server``, or ``server``; "4.0"/"4.3": in a Debian root, built on first
    use as root) and return its handle (``own=True``; closing it removes the node).

    ``streams=True`` also enables the ``rabbitmq_stream`` plugin, listening on
    127.0.0.1 at ``handle.stream_port`` (advertised as such). Off by default: the
    plugin adds to every boot, and only the streams tests need it. Super streams
    need RabbitMQ 3.11+ (so "4.3" here)."""
    if version != DEFAULT_VERSION:
        return _ChrootNode(version, reap_orphans=_reap_orphans, tls=tls, streams=streams)
    server = server or _find_rabbitmq_server()
    if server is None:
        raise BrokerUnavailable(
            "a node of the kit's own needs rabbitmq-server, which is not installed.\n"
            + HOW_TO_GET_A_BROKER
        )
    return _OwnNode(server, reap_orphans=_reap_orphans, tls=tls, streams=streams)
