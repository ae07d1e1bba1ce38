"""What the Docker way needs to know about the engine before a container starts.

Is an engine there, does it have a bridge network (else containers share the
host's network), which image to run, and which containers dead test runs left
behind. docker and testcontainers are imported only when this way is tried.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import logging
import os
import re
import secrets
import socket
import warnings
from typing import Any

from . import _kit
from ._env import DEFAULT_VERSION, DOCKER_DEFAULT_VERSION, ENV_DOCKER_NETWORK, ENV_IMAGE
from ._util import pid_alive

log = logging.getLogger("ackkit.testing")

NETWORK_MODES = ("auto", "host", "bridge")
CONTAINER_PREFIX = "ackkit-test-"
LOCAL_REPOSITORY = "ackkit-test/rabbitmq"  # the kit's own image (ackkit-testkit builds it)


def _docker_engine(timeout: float = 3.0) -> tuple[bool, str]:
    """(True, '') when a Docker engine answers, else (False, why)."""
    host = os.environ.get("DOCKER_HOST", "").strip() or "unix:///var/run/docker.sock"
    if host.startswith("unix://"):
        # Probe the socket ourselves first: the docker SDK leaks an unclosed socket
        # (a ResourceWarning) when nothing listens, and this is the common case.
        path = host[len("unix://") :]
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(timeout)
                sock.connect(path)
        except OSError as exc:
            return False, f"no Docker engine answers on {host} ({exc.strerror or exc})"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            docker: Any = importlib.import_module("docker")
    except ImportError:
        return False, "the docker Python package is not installed"
    client = None
    try:
        client = docker.from_env(timeout=int(max(1, timeout)))
        client.ping()
    except Exception as exc:
        return False, f"no Docker engine answered ({type(exc).__name__}: {str(exc)[:200]})"
    finally:
        if client is not None:
            with contextlib.suppress(Exception):
                client.close()
    return True, ""


def docker_client(timeout: int = 120) -> Any:
    """A docker-py client for the engine of the environment (DOCKER_HOST), imported on first use."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        docker: Any = importlib.import_module("docker")
    return docker.from_env(timeout=timeout)


def engine_is_local() -> bool:
    """True when the engine runs on this machine (a unix socket), so a published
    port can be bound to this machine's loopback address."""
    host = os.environ.get("DOCKER_HOST", "").strip()
    return not host or host.startswith("unix://")


def network_mode(client: Any) -> str:
    """ "host" or "bridge": how containers are reached.

    ``ACKKIT_TEST_DOCKER_NETWORK=host|bridge`` decides; by default an engine
    without a network named "bridge" (started with ``--bridge=none``) means host.
    """
    raw = os.environ.get(ENV_DOCKER_NETWORK, "").strip().lower() or "auto"
    if raw not in NETWORK_MODES:
        raise ValueError(f"{ENV_DOCKER_NETWORK} must be one of {', '.join(NETWORK_MODES)}: {raw!r}")
    if raw != "auto":
        return raw
    names = {net.name for net in client.networks.list()}
    return "bridge" if "bridge" in names else "host"


def docker_version(version: str = DEFAULT_VERSION) -> str:
    """The RabbitMQ version a container runs: ``version`` (``ACKKIT_TEST_RABBITMQ``)
    when it is a 4.x, else 4.3 (the default "3.10" means the machine's own server)."""
    return DOCKER_DEFAULT_VERSION if version == DEFAULT_VERSION else version


def local_image_name(version: str = DOCKER_DEFAULT_VERSION) -> str:
    """The name of the kit's locally built RabbitMQ image of `version`."""
    return f"{LOCAL_REPOSITORY}:{version}"


def local_image_version(image: str) -> str | None:
    """The version of a kit-made image name (``ackkit-test/rabbitmq:4.3`` -> "4.3"), else None."""
    repo, sep, tag = image.rpartition(":")
    return tag if sep and repo == LOCAL_REPOSITORY and tag else None


def image_exists(client: Any, name: str) -> bool:
    """Whether the engine behind `client` holds the image `name`."""
    import docker.errors

    try:
        client.images.get(name)
    except docker.errors.ImageNotFound:
        return False
    return True


def _kit_image(client: Any, version: str, *, required: bool) -> str | None:
    """The kit's own image for ``version``: built when missing by ackkit-testkit if it
    is installed; without it, the image when it exists, else None (or, ``required``,
    :class:`~._kit.TestkitMissing` saying how to install it)."""
    name = local_image_name(version)
    kit = _kit.testkit()
    if kit is not None:
        built: str = kit.ensure_local_image(client, version)
        return built
    if image_exists(client, name):
        return name
    if required:
        raise _kit.missing(f"the Docker image {name} (made from a Debian root)")
    return None


def choose_image(client: Any, mode: str, version: str = DOCKER_DEFAULT_VERSION) -> str:
    """The image to run for RabbitMQ ``version``.

    ``ACKKIT_TEST_RABBITMQ_IMAGE`` when set (the kit's own ``ackkit-test/rabbitmq:<v>``
    is built when missing, which needs ackkit-testkit; any other name is pulled as
    usual). Otherwise the kit's image when it exists or the engine has no bridge (an
    engine set up locally, which need not reach a registry; without ackkit-testkit
    to build it, the official image), else the official ``rabbitmq:<version>``.
    """
    explicit = os.environ.get(ENV_IMAGE, "").strip()
    if explicit:
        local = local_image_version(explicit)
        return (_kit_image(client, local, required=True) or explicit) if local else explicit
    if mode == "host" or image_exists(client, local_image_name(version)):
        return _kit_image(client, version, required=False) or f"rabbitmq:{version}"
    return f"rabbitmq:{version}"


def _host_tag() -> str:
    return hashlib.sha1(socket.gethostname().encode()).hexdigest()[:8]


def container_name() -> str:
    """``ackkit-test-<host>-<pid>-<rand>``: whose container it is, for the reaper."""
    return f"{CONTAINER_PREFIX}{_host_tag()}-{os.getpid()}-{secrets.token_hex(3)}"


_NAME_RE = re.compile(rf"^/?{CONTAINER_PREFIX}([0-9a-f]{{8}})-(\d+)-[0-9a-f]+$")


def reap_dead_containers(client: Any) -> list[str]:
    """Remove this machine's kit containers whose test process is gone; their names.

    atexit does not run when a test run is SIGKILLed, and Ryuk (testcontainers'
    reaper) cannot run on an engine without a bridge network.
    """
    mine, removed = _host_tag(), []
    for container in client.containers.list(all=True, filters={"name": CONTAINER_PREFIX}):
        m = _NAME_RE.match(container.name or "")
        if not m or m.group(1) != mine:
            continue
        owner = int(m.group(2))
        if owner == os.getpid() or pid_alive(owner):
            continue
        log.warning("removing container %s left behind by dead test run %s", container.name, owner)
        with contextlib.suppress(Exception):
            container.remove(force=True)
            removed.append(container.name)
    return removed


def disable_ryuk() -> None:
    """Ryuk publishes a port, which an engine without a bridge network cannot do."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from testcontainers.core.config import testcontainers_config

    testcontainers_config.ryuk_disabled = True


def docker_settings(version: str = DEFAULT_VERSION) -> tuple[str, str]:
    """(image, network mode) for the next container of RabbitMQ ``version`` (as
    ``ACKKIT_TEST_RABBITMQ`` gives it); reaps dead runs' containers first."""
    client = docker_client()
    try:
        mode = network_mode(client)
        reap_dead_containers(client)
        image = choose_image(client, mode, docker_version(version))
    finally:
        with contextlib.suppress(Exception):
            client.close()
    if mode == "host":
        disable_ryuk()
    return image, mode


def rabbitmq_conf(listener: str, *, guest_from_anywhere: bool) -> bytes:
    """A conf.d file for the container: the AMQP listener, logs on the console
    (``docker logs``), and whether guest may log in from other addresses (needed
    behind a published port, where connections come from the bridge)."""
    return (
        "# written by the ackkit test kit\n"
        f"listeners.tcp.default = {listener}\n"
        f"loopback_users.guest = {'false' if guest_from_anywhere else 'true'}\n"
        "log.console = true\n"
        "log.console.level = info\n"
    ).encode("ascii")
