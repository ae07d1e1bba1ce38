"""Provisioning of a real RabbitMQ broker for tests: which provider gives it.

Order (see ``provision_broker``):

1. ``AMQP_URL`` is set: use that broker (``own=False``; ``_provider_url``).
2. A Docker engine answers: a RabbitMQ container through testcontainers
   (``own=True``; ``_provider_docker``, with ``_docker_engine`` choosing the image
   and the network; ackkit-testkit builds the kit's own image when one is needed).
3. A throwaway node of the kit's own, with its own data directory, ports, node
   name and Erlang cookie (``own=True``): from the machine's ``rabbitmq-server``
   for the default version "3.10", or inside a Debian root holding RabbitMQ 4.0 /
   4.3. Those nodes come with the separate distribution ackkit-testkit
   (``ackkit_testkit.own_node``; :mod:`._kit` finds it).
4. Otherwise :class:`BrokerUnavailable` says how to get a broker (``pip install
   ackkit-testkit`` first when that is what is missing).

``ACKKIT_TEST_BROKER=url|docker|own`` forces one of the ways (``auto`` is the default).
``ACKKIT_TEST_RABBITMQ=3.10|4.0|4.3`` picks the version of the kit's own brokers
(3.10, the default, means the machine's own ``rabbitmq-server``, whatever its version).

Only the standard library is imported at module level; pika, docker,
testcontainers and ackkit_testkit are imported when they are needed.

The probes are looked up in this module's namespace when a broker is
provisioned, so a test can replace them here (``monkeypatch.setattr(_broker,
"_docker_engine", ...)``).
"""

from __future__ import annotations

import os

from . import _kit
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
from ._options import NodeTLS
from ._provider_docker import _docker_engine as _docker_engine
from ._provider_docker import _DockerBroker as _DockerBroker
from ._provider_docker import _rabbitmq_container_class as _rabbitmq_container_class
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

_OWN_NODE = "a RabbitMQ node of the kit's own"


def _find_rabbitmq_server() -> str | None:
    """The machine's ``rabbitmq-server`` (None: not installed, or no ackkit-testkit
    to start a node from it)."""
    kit = _kit.testkit()
    if kit is None:
        return None
    found: str | None = kit.find_rabbitmq_server()
    return found


def _own_node(version: str, tls: NodeTLS | None = None, server: str | None = None) -> BrokerHandle:
    """A throwaway node of the kit's own of RabbitMQ ``version`` (ackkit-testkit)."""
    node: BrokerHandle = _kit.require(_OWN_NODE).own_node(version, server=server, tls=tls)
    return node


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

    if _kit.testkit() is None:
        tried.append(f"{_OWN_NODE}: ackkit-testkit is not installed")
        raise _kit.missing(_OWN_NODE, tried=tried)
    if version != DEFAULT_VERSION:
        return _own_node(version)
    server = _find_rabbitmq_server()
    if server is not None:
        return _own_node(version, server=server)
    tried.append("rabbitmq-server: not found on PATH or in " + ", ".join(_SBIN_DIRS[:4]))
    raise BrokerUnavailable(
        "no RabbitMQ broker for the tests. Tried:\n  - "
        + "\n  - ".join(tried)
        + "\n"
        + HOW_TO_GET_A_BROKER
    )
