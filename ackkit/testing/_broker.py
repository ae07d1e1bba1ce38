"""Provisioning of a real RabbitMQ broker for tests: which provider gives it.

Order (see ``provision_broker``):

1. ``AMQP_URL`` is set: use that broker (``own=False``; ``_provider_url``).
2. A Docker engine answers: a RabbitMQ container through testcontainers
   (``own=True``; ``_provider_docker``, with ``_docker_engine`` choosing the image
   and the network, and ``_docker_image`` building the kit's own image if needed).
3. A throwaway node of the kit's own, with its own data directory, ports, node
   name and Erlang cookie (``own=True``): from the machine's ``rabbitmq-server``
   (``_provider_node``) for the default version "3.10", or inside a Debian root
   holding RabbitMQ 4.0 / 4.3 (``_provider_chroot``, ``_rootfs``).
4. Otherwise :class:`BrokerUnavailable` says how to get a broker.

``ACKKIT_TEST_BROKER=url|docker|own`` forces one of the ways (``auto`` is the default).
``ACKKIT_TEST_RABBITMQ=3.10|4.0|4.3`` picks the version of the kit's own brokers
(3.10, the default, means the machine's own ``rabbitmq-server``, whatever its version).

Only the standard library is imported at module level; pika, docker and
testcontainers are imported when they are needed.

The probes and the reaper are looked up in this module's namespace when a broker
is provisioned, so a test can replace them here (``monkeypatch.setattr(_broker,
"_docker_engine", ...)``); the private provider classes are importable from here too.
"""

from __future__ import annotations

import os
import threading

from ._docker_engine import docker_settings as _docker_settings
from ._env import (
    _SBIN_DIRS,
    DEFAULT_VERSION,
    ENV_MODE,
    ENV_URL,
    ENV_VERSION,
    HOW_TO_GET_A_BROKER,
    MODES,
    wanted_version,
)
from ._errors import BrokerError, BrokerNotOwned, BrokerUnavailable, QueueNotFound
from ._handle import BrokerHandle
from ._node_os import _find_rabbitmq_server as _find_rabbitmq_server
from ._node_os import _reap_dead_runs
from ._provider_chroot import _ChrootNode as _ChrootNode
from ._provider_docker import _docker_engine as _docker_engine
from ._provider_docker import _DockerBroker as _DockerBroker
from ._provider_docker import _rabbitmq_container_class as _rabbitmq_container_class
from ._provider_node import NodeTLS
from ._provider_node import _OwnNode as _OwnNode
from ._provider_url import _UrlBroker as _UrlBroker
from ._queries import QueueCounts

__all__ = [
    "ENV_MODE",
    "ENV_URL",
    "ENV_VERSION",
    "BrokerError",
    "BrokerHandle",
    "BrokerNotOwned",
    "BrokerUnavailable",
    "NodeTLS",
    "QueueCounts",
    "QueueNotFound",
    "provision_broker",
]

# Nodes that dead test runs left behind are reaped once per process and data
# directory parent, before the first node of the kit's own boots there (a test
# empties ``_reaped`` to reap again).
_reaped: set[str] = set()
_reap_lock = threading.Lock()


def _reap_orphans(parent: str) -> None:
    """Kill nodes (and remove data directories) left behind by dead test runs; once."""
    with _reap_lock:
        if parent in _reaped:
            return
        _reaped.add(parent)
    _reap_dead_runs(parent)


def _own_node(version: str, tls: NodeTLS | None = None) -> BrokerHandle:
    """A throwaway node of the kit's own of RabbitMQ ``version``."""
    if version != DEFAULT_VERSION:
        return _ChrootNode(version, reap_orphans=_reap_orphans, tls=tls)
    server = _find_rabbitmq_server()
    if server is None:
        raise BrokerUnavailable(
            "a node of the kit's own needs rabbitmq-server, which is not installed.\n"
            + HOW_TO_GET_A_BROKER
        )
    return _OwnNode(server, reap_orphans=_reap_orphans, tls=tls)


def provision_broker(
    mode: str | None = None,
    *,
    exclusive: bool = False,
    tls: NodeTLS | None = None,
    rabbitmq: str | None = None,
) -> BrokerHandle:
    """Provision a real RabbitMQ broker and return its handle.

    The handle is a context manager; leaving it stops whatever the kit started
    (and an atexit hook does the same if a run ends without leaving it).

    ``mode``: "auto" (default, or ``$ACKKIT_TEST_BROKER``), "url", "docker" or "own".
    ``exclusive=True`` asks for a broker the kit owns (docker or own node): ``AMQP_URL``
    is ignored then, and forcing "url" is an error.
    ``tls``: also listen for amqps with these files (a node of the kit's own only;
    its URL is ``handle.amqps_url``).
    ``rabbitmq``: version of the kit's own brokers, "3.10" (the machine's
    ``rabbitmq-server``), "4.0" or "4.3" (a node in a Debian root); default
    ``$ACKKIT_TEST_RABBITMQ``, else "3.10". An ``AMQP_URL`` broker is used whatever
    its version.
    """
    version = wanted_version(rabbitmq)
    if tls is not None:
        if (mode or os.environ.get(ENV_MODE) or "auto").strip().lower() in ("url", "docker"):
            raise BrokerUnavailable("a TLS listener needs a node of the kit's own (mode 'own')")
        return _own_node(version, tls)
    chosen = (mode or os.environ.get(ENV_MODE) or "auto").strip().lower()
    if chosen not in MODES:
        raise ValueError(f"broker mode must be one of {', '.join(MODES)}, not {chosen!r}")
    url = os.environ.get(ENV_URL, "").strip()
    tried: list[str] = []

    if chosen == "url" or (chosen == "auto" and url and not exclusive):
        if exclusive:
            raise BrokerUnavailable(
                f"a broker node of the test kit's own was requested, but {ENV_MODE}=url forces "
                f"the external broker of {ENV_URL}"
            )
        if not url:
            raise BrokerUnavailable(
                f"{ENV_MODE}=url but {ENV_URL} is not set.\n{HOW_TO_GET_A_BROKER}"
            )
        return _UrlBroker(url)
    tried.append(
        f"{ENV_URL}: " + ("ignored (a broker of the kit's own was asked for)" if url else "not set")
    )

    if chosen in ("auto", "docker"):
        ok, why = _docker_engine()
        if ok:
            container_class = _rabbitmq_container_class()
            image, network = _docker_settings(version)
            return _DockerBroker(container_class, image=image, network=network)
        if chosen == "docker":
            raise BrokerUnavailable(f"{ENV_MODE}=docker but {why}.\n{HOW_TO_GET_A_BROKER}")
        tried.append(f"Docker: {why}")

    if version != DEFAULT_VERSION:
        return _own_node(version)
    server = _find_rabbitmq_server()
    if server is not None:
        return _OwnNode(server, reap_orphans=_reap_orphans)
    tried.append("rabbitmq-server: not found on PATH or in " + ", ".join(_SBIN_DIRS[:4]))
    raise BrokerUnavailable(
        "no RabbitMQ broker for the tests. Tried:\n  - "
        + "\n  - ".join(tried)
        + "\n"
        + HOW_TO_GET_A_BROKER
    )
