"""A throwaway PostgreSQL container started through testcontainers
(``ACKKIT_TEST_POSTGRES=docker``, or when there is neither a DSN nor server binaries).

The image (:func:`pg_image_choice`): ``ACKKIT_TEST_POSTGRES_IMAGE`` when set; else
the kit's own ``ackkit-test/postgres:17`` on an engine without a bridge network
(which usually cannot pull; built from a Debian root when missing, :mod:`._pg_image`)
or when it exists; else the official ``postgres:17``. How it is reached follows the
RabbitMQ container (``ACKKIT_TEST_DOCKER_NETWORK``): on the host's network the server
listens on 127.0.0.1 only, on a free port of its own; on a bridge its port is
published on 127.0.0.1. The superuser ``postgres`` has a password made up here,
which the handle's repr and its errors never show.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import secrets
import signal
import time
import warnings
from typing import Any

from ackkit.testing import mask_url
from ackkit.testing.providers import (
    ENV_BOOT_TIMEOUT,
    ENV_POSTGRES_IMAGE,
    container_name,
    disable_ryuk,
    docker_client,
    engine_is_local,
    env_float,
    free_port,
    image_exists,
    mask_secrets,
    network_mode,
    reap_dead_containers,
)

from ._pg_image import (
    DEFAULT_PG_VERSION,
    ensure_pg_image,
    local_pg_image_name,
    local_pg_image_version,
)
from ._postgres import PostgresUnavailable

__all__ = ["DockerPostgres", "pg_image_choice", "provision_docker_postgres"]

log = logging.getLogger("ackkit.testing")

PG_PORT = 5432  # inside the container, when it has a network of its own
_STOP_SIGNALS = {"smart": signal.SIGTERM, "fast": signal.SIGINT, "immediate": signal.SIGQUIT}


def pg_image_choice(
    explicit: str, network: str, kit_image_exists: bool, version: str = DEFAULT_PG_VERSION
) -> tuple[str, bool]:
    """(image, whether it is the kit's own, to be built when missing).

    ``explicit``: ``ACKKIT_TEST_POSTGRES_IMAGE`` ("" when not set), used as it is;
    ``network``: "host" or "bridge"; ``kit_image_exists``: the engine has
    ``ackkit-test/postgres:<version>``.
    """
    if explicit:
        return explicit, local_pg_image_version(explicit) is not None
    if network == "host" or kit_image_exists:
        return local_pg_image_name(version), True
    return f"postgres:{version}", False


def choose_pg_image(client: Any, network: str, version: str = DEFAULT_PG_VERSION) -> str:
    """The image to run on the engine of ``client`` (the kit's own is built when missing)."""
    explicit = os.environ.get(ENV_POSTGRES_IMAGE, "").strip()
    kit_exists = image_exists(client, local_pg_image_name(version))
    name, own = pg_image_choice(explicit, network, kit_exists, version)
    if own:
        return ensure_pg_image(client, local_pg_image_version(name) or version)
    return name


def _container_class() -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            from testcontainers.core.container import DockerContainer
        except ImportError as exc:
            raise PostgresUnavailable(
                "a PostgreSQL container needs testcontainers (pip install 'testcontainers>=4')"
            ) from exc
    return DockerContainer


class DockerPostgres:
    """A PostgreSQL container of the kit's own (``own=True``): ``dsn``; ``stop(mode)``
    stops the server (and so the container, whose data stays), ``start()`` starts
    the same container again (same data and DSN); ``close()`` removes it."""

    own = True
    kind = "docker"

    def __init__(self, image: str, network: str, *, container_class: Any = None) -> None:
        if network not in ("host", "bridge"):
            raise ValueError(f"network must be 'host' or 'bridge', not {network!r}")
        self.image = image
        self.network = network
        self.boot_seconds: float | None = None
        self._class = container_class or _container_class()
        self._password = secrets.token_hex(16)
        self._boot_timeout = env_float(ENV_BOOT_TIMEOUT, 60.0)
        self._port = 0
        self._host = "127.0.0.1"
        self._name = container_name()
        self._container: Any = None
        self._closed = False
        for attempt in range(3):
            try:
                self._boot_new_container()
                break
            except PostgresUnavailable as exc:
                self._remove_container()
                text = str(exc).lower()
                if attempt < 2 and ("could not bind" in text or "address already in use" in text):
                    log.info("port clash while booting %s, retrying on another port", self._name)
                    continue
                raise
        atexit.register(self.close)

    @property
    def dsn(self) -> str:
        return f"postgresql://postgres:{self._password}@{self._host}:{self._port}/postgres"

    def __repr__(self) -> str:
        return f"<DockerPostgres {mask_url(self.dsn)} image={self.image} own=True>"

    # -- container -------------------------------------------------------------------

    def _boot_new_container(self) -> None:
        container = self._class(self.image)
        container.with_name(self._name)
        container.with_env("POSTGRES_PASSWORD", self._password)
        own_image = local_pg_image_version(self.image) is not None
        settings = ["-c", "fsync=off"]
        if self.network == "host":
            self._port = free_port()
            container.with_env("PGPORT", str(self._port))
            container.with_kwargs(network_mode="host")
            settings += ["-c", "listen_addresses=127.0.0.1"]
        else:
            container.with_env("POSTGRES_LISTEN", "*")
            if engine_is_local():  # published on this machine's loopback only
                self._port = free_port()
                container.ports[f"{PG_PORT}/tcp"] = ("127.0.0.1", self._port)
            else:
                container.with_exposed_ports(PG_PORT)
        if not own_image:  # the official image: its entrypoint runs `postgres <settings>`
            container.with_command(["postgres", *settings])
        self._container = container
        started = time.monotonic()
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                container.start()
        except Exception as exc:
            raise PostgresUnavailable(
                f"the PostgreSQL container ({self.image}) did not start: "
                f"{self._masked(str(exc))[:2000]}\n(set {ENV_POSTGRES_IMAGE} to use another "
                "image, or ACKKIT_TEST_POSTGRES=own to use the machine's server binaries)"
            ) from exc
        self._wait_for_boot(started)

    def _masked(self, text: str) -> str:
        return mask_secrets(text).replace(self._password, "***")

    def _status(self) -> str:
        wrapped = self._container.get_wrapped_container()
        wrapped.reload()
        return str(wrapped.status)

    def _answers(self) -> bool:
        import psycopg

        try:
            with psycopg.connect(self.dsn, connect_timeout=2) as conn:
                conn.execute("SELECT 1")
        except psycopg.Error:
            return False
        return True

    def _wait_for_boot(self, started: float) -> None:
        deadline = started + self._boot_timeout
        while True:
            status = self._status()
            if status in ("exited", "dead"):
                raise PostgresUnavailable(
                    f"the PostgreSQL container {self._name} ({self.image}) exited while "
                    f"starting.\n{self._log_tail()}"
                )
            if status == "running":
                if self.network == "bridge" and not engine_is_local():
                    self._host = self._container.get_container_host_ip()
                    self._port = int(self._container.get_exposed_port(PG_PORT))
                if self._answers():
                    break
            if time.monotonic() > deadline:
                raise PostgresUnavailable(
                    f"the PostgreSQL container {self._name} ({self.image}) did not answer "
                    f"within {self._boot_timeout:.0f}s (raise {ENV_BOOT_TIMEOUT} if the "
                    f"machine is slow).\n{self._log_tail()}"
                )
            time.sleep(0.1)
        self.boot_seconds = time.monotonic() - started
        log.info(
            "PostgreSQL container %s (%s, %s network) up in %.1fs at %s",
            self._name, self.image, self.network, self.boot_seconds, mask_url(self.dsn),
        )  # fmt: skip

    def log_text(self) -> str | None:
        """What the server wrote to the container's log (None: no container)."""
        if self._container is None:
            return None
        try:
            out, err = self._container.get_logs()
        except Exception:
            return None
        return self._masked(b"".join(x for x in (out, err) if x).decode("utf-8", "replace"))

    def _log_tail(self, lines: int = 30) -> str:
        text = self.log_text() or "(the container wrote no log)"
        return "--- container log (last lines) ---\n" + "\n".join(text.splitlines()[-lines:])

    def _remove_container(self) -> None:
        container, self._container = self._container, None
        if container is not None:
            with contextlib.suppress(Exception):
                container.stop()

    # -- control ---------------------------------------------------------------------

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (``mode``: smart, fast or immediate, as ``pg_ctl stop -m``);
        the container stops with it and keeps its data."""
        if mode not in _STOP_SIGNALS:
            raise ValueError(f"mode must be one of {', '.join(_STOP_SIGNALS)}, not {mode!r}")
        if self._container is None:
            raise RuntimeError(f"{self!r} is closed")
        if self._status() != "running":
            return
        with contextlib.suppress(Exception):
            self._container.get_wrapped_container().kill(signal=_STOP_SIGNALS[mode].name)
        deadline = time.monotonic() + 60
        while self._status() == "running":
            if time.monotonic() > deadline:
                raise PostgresUnavailable(f"{self._name} still runs 60 s after a {mode} stop")
            time.sleep(0.05)

    def start(self) -> None:
        """Start the stopped container again and wait until the server answers."""
        if self._container is None:
            raise RuntimeError(f"{self!r} is closed")
        if self._status() == "running" and self._answers():
            return
        started = time.monotonic()
        self._container.get_wrapped_container().start()
        self._wait_for_boot(started)

    def close(self) -> None:
        """Remove the container (and its data)."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(Exception):
            atexit.unregister(self.close)
        self._remove_container()


def provision_docker_postgres(version: str = DEFAULT_PG_VERSION) -> DockerPostgres:
    """A PostgreSQL container on the engine of ``DOCKER_HOST`` (or the usual socket);
    containers of dead test runs are removed first."""
    container_class = _container_class()
    client = docker_client()
    try:
        network = network_mode(client)
        reap_dead_containers(client)
        image = choose_pg_image(client, network, version)
    except PostgresUnavailable:
        raise
    except Exception as exc:
        raise PostgresUnavailable(f"no PostgreSQL image on this Docker engine: {exc}") from exc
    finally:
        with contextlib.suppress(Exception):
            client.close()
    if network == "host":
        disable_ryuk()
    return DockerPostgres(image, network, container_class=container_class)
