"""A RabbitMQ container started through testcontainers, when a Docker engine answers.

docker and testcontainers are imported only when this way is tried.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import socket
import time
import urllib.parse
import warnings
from typing import Any

from ._env import ENV_IMAGE, ENV_MODE
from ._errors import BrokerError, BrokerUnavailable
from ._handle import BrokerHandle
from ._registry import _register, _unregister
from ._util import mask_secrets


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


def _rabbitmq_container_class() -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            from testcontainers.community.rabbitmq import RabbitMqContainer
        except ImportError:
            try:
                from testcontainers.rabbitmq import RabbitMqContainer
            except ImportError as exc:
                raise BrokerUnavailable(
                    "a Docker engine answers but testcontainers is not installed "
                    "(pip install 'testcontainers>=4')"
                ) from exc
    return RabbitMqContainer


class _DockerBroker(BrokerHandle):
    """A RabbitMQ container started through testcontainers.

    ``stop()``/``start()``/``restart()`` stop and start the RabbitMQ application
    inside the container (rabbitmqctl stop_app/start_app), so the mapped port
    stays the same. ``kill()`` kills the container and starts it again; Docker
    may map a different host port then, so read ``url`` again after ``kill()``.
    """

    kind = "docker"

    def __init__(self, image: str, container_class: Any) -> None:
        """``container_class``: testcontainers' ``RabbitMqContainer`` (what
        ``_rabbitmq_container_class()`` returns; ``provision_broker`` looks it up)."""
        self._container = container_class(image)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                self._container.start()
        except Exception as exc:
            with contextlib.suppress(Exception):
                self._container.stop()
            raise BrokerUnavailable(
                f"a Docker engine answers but the RabbitMQ container ({image}) did not start: "
                f"{mask_secrets(str(exc))[:2000]}\n(set {ENV_IMAGE} to use another image, or "
                f"{ENV_MODE}=own to use a local rabbitmq-server instead)"
            ) from exc
        super().__init__(self._container_url(), own=True, amqp_port=0, node_name=None)
        self._refresh()
        _register(self)

    def _container_url(self) -> str:
        c = self._container
        host = c.get_container_host_ip()
        port = int(c.get_exposed_port(c.port))
        user = urllib.parse.quote(c.username, safe="")
        password = urllib.parse.quote(c.password, safe="")
        vhost = urllib.parse.quote(c.vhost, safe="")
        return f"amqp://{user}:{password}@{host}:{port}/{vhost}"

    def _refresh(self) -> None:
        self._url = self._container_url()
        self.amqp_port = int(urllib.parse.urlsplit(self._url).port or 5672)

    def ctl(self, *args: str, timeout: float = 60.0) -> str:
        code, output = self._container.exec(["rabbitmqctl", *args])
        text = output.decode("utf-8", "replace") if isinstance(output, bytes) else str(output)
        if code != 0:
            raise BrokerError(
                f"rabbitmqctl {' '.join(args)} in the container failed ({code}):\n{text[-4000:]}"
            )
        return text

    def stop(self) -> None:
        self.ctl("stop_app")

    def start(self) -> None:
        if self.ping():
            return
        self.ctl("start_app")
        self.wait_until_up()

    def restart(self) -> None:
        self.stop()
        self.start()

    def kill(self, *, flush_metadata: bool = True) -> None:
        if flush_metadata:
            self._sync_metadata()
        wrapped = self._container.get_wrapped_container()
        wrapped.kill()
        wrapped.start()
        deadline = time.monotonic() + 60
        while True:
            try:
                wrapped.reload()
                self._refresh()
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        self.wait_until_up()

    def log_text(self) -> str | None:
        try:
            out, err = self._container.get_logs()
        except Exception:
            return None
        return b"".join(x for x in (out, err) if x).decode("utf-8", "replace")

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        _unregister(self)
        with contextlib.suppress(Exception):
            self._container.stop()
