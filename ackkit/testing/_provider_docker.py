"""A RabbitMQ container started through testcontainers, when a Docker engine answers.

Two ways to reach the container (``_docker_engine.network_mode``):

* bridge (a usual engine): the AMQP port is published, on this machine's
  loopback address and a port picked here when the engine is local (so the
  URL stays the same across ``kill()``/``start()``), else where testcontainers
  says.
* host (an engine without a bridge network, or ``ACKKIT_TEST_DOCKER_NETWORK=host``):
  the container shares the host's network, and the node binds AMQP,
  distribution and epmd to 127.0.0.1 on ports of its own, under a node name
  of its own, beside any other broker of the machine.

rabbitmqctl and erl_call run inside the container (``docker exec``).
"""

from __future__ import annotations

import contextlib
import logging
import re
import time
import warnings
from typing import Any

from ._docker_engine import _docker_engine as _docker_engine
from ._docker_engine import container_name, engine_is_local, rabbitmq_conf
from ._env import ENV_BOOT_TIMEOUT, ENV_DOCKER_NETWORK, ENV_IMAGE, ENV_MODE, _env_float
from ._errors import BrokerError, BrokerUnavailable
from ._handle import BrokerHandle
from ._options import PLUGINS
from ._registry import _register, _unregister
from ._util import free_port, mask_secrets

log = logging.getLogger("ackkit.testing")

AMQP_PORT = 5672  # inside the container, when it has a network of its own
CONF_PATH = "/etc/rabbitmq/conf.d/99-ackkit.conf"

# erl_call evaluates an expression on the node in ~0.1 s; rabbitmqctl boots a VM (~1 s).
_ERL_CALL = (
    "for c in /usr/lib/erlang/bin/erl_call /usr/local/lib/erlang/bin/erl_call "
    "/usr/lib/erlang/lib/erl_interface-*/bin/erl_call "
    "/usr/local/lib/erlang/lib/erl_interface-*/bin/erl_call; do "
    'if [ -x "$c" ]; then printf "%s\\n" "$1" | '
    '"$c" -sname "$RABBITMQ_NODENAME" -timeout "$2" -e; exit $?; fi; done; exit 127'
)


def _rabbitmq_container_class() -> Any:
    """testcontainers' generic container class (the kit waits for AMQP itself)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            from testcontainers.core.container import DockerContainer
        except ImportError as exc:
            raise BrokerUnavailable(
                "a Docker engine answers but testcontainers is not installed "
                "(pip install 'testcontainers>=4')"
            ) from exc
    return DockerContainer


def _text(output: Any) -> str:
    return output.decode("utf-8", "replace") if isinstance(output, bytes) else str(output)


class _DockerBroker(BrokerHandle):
    """A RabbitMQ container of the kit's own (``own=True``).

    ``stop()`` stops the RabbitMQ application (rabbitmqctl stop_app) and
    ``start()`` starts it again; ``kill()`` SIGKILLs the container and
    ``start()`` starts the same container (same data, node name and URL).
    """

    kind = "docker"

    def __init__(self, container_class: Any, *, image: str, network: str) -> None:
        """``container_class``: testcontainers' ``DockerContainer`` (what
        ``_rabbitmq_container_class()`` returns); ``image`` and ``network``
        ("host" or "bridge") come from ``_docker_engine.docker_settings()``."""
        if network not in ("host", "bridge"):
            raise ValueError(f"network must be 'host' or 'bridge', not {network!r}")
        self.image = image
        self.network = network
        self.boot_seconds: float | None = None
        self._class = container_class
        self._boot_timeout = _env_float(ENV_BOOT_TIMEOUT, 60.0)
        self._erl_call_ok: bool | None = None
        self._host = "127.0.0.1"
        self._published: int | None = None  # host port of a published AMQP port
        self._dist_port = self._epmd_port = 0
        name = container_name()
        super().__init__("", own=True, amqp_port=0, node_name=f"rabbit-{name}@localhost")
        self._name = name
        self._container: Any = None
        for attempt in range(3):
            try:
                self._boot_new_container()
                break
            except BrokerUnavailable as exc:
                self._remove_container()
                if attempt < 2 and "eaddrinuse" in str(exc).lower():
                    log.info("port clash while booting %s, retrying with other ports", name)
                    continue
                raise
        _register(self)

    # -- container ----------------------------------------------------------------

    def _boot_new_container(self) -> None:
        env = {
            "HOME": "/var/lib/rabbitmq",
            "RABBITMQ_NODENAME": str(self.node_name),
            # The kit's plugins instead of the image's list (e.g. rabbitmq_prometheus),
            # as on its own nodes; the node writes them into its enabled_plugins file.
            "RABBITMQ_ENABLED_PLUGINS": ",".join(PLUGINS),
        }
        kwargs: dict[str, Any] = {}
        if self.network == "host":
            self.amqp_port = free_port()
            self._dist_port = free_port(avoid=frozenset({self.amqp_port}))
            self._epmd_port = free_port(avoid=frozenset({self.amqp_port, self._dist_port}))
            env.update(
                RABBITMQ_DIST_PORT=str(self._dist_port),
                ERL_EPMD_PORT=str(self._epmd_port),
                ERL_EPMD_ADDRESS="127.0.0.1",
                RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}",
            )
            kwargs["network_mode"] = "host"
            conf = rabbitmq_conf(f"127.0.0.1:{self.amqp_port}", guest_from_anywhere=False)
        else:
            conf = rabbitmq_conf(str(AMQP_PORT), guest_from_anywhere=True)
        container = self._class(self.image)
        container.with_name(self._name)
        for key, value in env.items():
            container.with_env(key, value)
        if self.network == "bridge":
            if engine_is_local():
                # published on this machine's loopback only, on a port that stays
                self._published = free_port()
                container.ports[f"{AMQP_PORT}/tcp"] = ("127.0.0.1", self._published)
            else:
                container.with_exposed_ports(AMQP_PORT)
        container.with_kwargs(**kwargs)
        if not hasattr(container, "with_copy_into_container"):
            raise BrokerUnavailable("the Docker way needs testcontainers>=4.15")
        container.with_copy_into_container(conf, CONF_PATH)
        self._container = container
        started = time.monotonic()
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                container.start()
        except Exception as exc:
            raise BrokerUnavailable(
                f"a Docker engine answers but the RabbitMQ container ({self.image}) did not "
                f"start: {mask_secrets(str(exc))[:2000]}\n(set {ENV_IMAGE} to use another "
                f"image, {ENV_DOCKER_NETWORK}=host|bridge to choose how it is reached, or "
                f"{ENV_MODE}=own to use a local rabbitmq-server instead)"
            ) from exc
        self._wait_for_boot(started)

    def _locate(self) -> None:
        """URL and port of the AMQP listener as seen from here."""
        if self.network == "bridge":
            if self._published is not None:
                self.amqp_port = self._published
            else:
                self._host = self._container.get_container_host_ip()
                self.amqp_port = int(self._container.get_exposed_port(AMQP_PORT))
        self._url = f"amqp://guest:guest@{self._host}:{self.amqp_port}/%2F"

    def _status(self) -> str:
        wrapped = self._container.get_wrapped_container()
        wrapped.reload()
        return str(wrapped.status)

    def _wait_for_boot(self, started: float) -> None:
        deadline = started + self._boot_timeout
        located = False
        while True:
            status = self._status()
            if status in ("exited", "dead"):
                raise BrokerUnavailable(
                    f"the RabbitMQ container {self._name} ({self.image}) exited while "
                    f"booting.\n{self._log_tail()}"
                )
            if status == "running" and not located:
                self._locate()
                located = True
            if located and self.ping(timeout=5.0):
                break
            if time.monotonic() > deadline:
                raise BrokerUnavailable(
                    f"the RabbitMQ container {self._name} ({self.image}) did not answer AMQP "
                    f"within {self._boot_timeout:.0f}s (raise {ENV_BOOT_TIMEOUT} if the machine "
                    f"is slow).\n{self._log_tail()}"
                )
            time.sleep(0.1)
        self.boot_seconds = time.monotonic() - started
        log.info(
            "RabbitMQ container %s (%s, %s network) up in %.1fs at %s",
            self._name,
            self.image,
            self.network,
            self.boot_seconds,
            self.masked_url,
        )

    def _log_tail(self, lines: int = 40) -> str:
        text = self.log_text() or "(the container wrote no log)"
        return "--- container log (last lines) ---\n" + "\n".join(text.splitlines()[-lines:])

    def _remove_container(self) -> None:
        container, self._container = self._container, None
        if container is not None:
            with contextlib.suppress(Exception):
                container.stop()

    # -- rabbitmqctl / erl_call -------------------------------------------------------

    def _exec(self, command: list[str]) -> tuple[int, str]:
        if self._container is None:
            raise BrokerError(f"{self!r} is closed")
        code, output = self._container.exec(command)
        return int(code), _text(output)

    def ctl(self, *args: str, timeout: float = 60.0) -> str:
        code, text = self._exec(["timeout", str(max(1, int(timeout))), "rabbitmqctl", *args])
        if code == 124:
            raise BrokerError(f"rabbitmqctl {' '.join(args)} timed out after {timeout:.0f}s")
        if code != 0:
            raise BrokerError(
                f"rabbitmqctl {' '.join(args)} in the container failed with exit code "
                f"{code}:\n{mask_secrets(text[-4000:])}"
            )
        return text

    def _erl_eval(self, expr: str, timeout: int = 10) -> str | None:
        if self._erl_call_ok is False or self._container is None:
            return None
        try:
            code, text = self._exec(["sh", "-c", _ERL_CALL, "sh", expr, str(timeout)])
        except Exception as exc:
            log.debug("erl_call in the container failed: %s", exc)
            return None
        if code == 127:
            self._erl_call_ok = False  # no erl_call in this image: rabbitmqctl it is
            return None
        m = re.fullmatch(r'\{ok,\s*"OK;(.*)"\}', text.strip(), re.S)
        if code != 0 or m is None:
            log.debug("erl_call gave %s: %r", code, text[:300])
            return None
        self._erl_call_ok = True
        return m.group(1)

    # -- public control -----------------------------------------------------------

    def stop(self) -> None:
        """Stop the RabbitMQ application (the container keeps running)."""
        if self._container is None or self._status() != "running" or not self.ping():
            return
        if self._erl_eval('ok = rabbit:stop(), "OK;".', timeout=60) is None:
            self.ctl("stop_app")

    def start(self) -> None:
        """Start the container again after ``kill()``, or the application after ``stop()``."""
        if self._closed:
            raise BrokerError(f"{self!r} is closed")
        if self._status() != "running":
            started = time.monotonic()
            self._container.get_wrapped_container().start()
            self._wait_for_boot(started)
            return
        if self.ping():
            return
        if self._erl_eval('ok = rabbit:start(), "OK;".', timeout=120) is None:
            self.ctl("start_app")
        self.wait_until_up(self._boot_timeout)

    def restart(self) -> None:
        self.stop()
        self.start()

    def kill(self, *, flush_metadata: bool = True) -> None:
        """SIGKILL the container (every process of the node); ``start()`` brings it back."""
        if flush_metadata and self.ping(timeout=2.0):
            self._sync_metadata()
        wrapped = self._container.get_wrapped_container()
        with contextlib.suppress(Exception):
            wrapped.kill()
        deadline = time.monotonic() + 30
        while self._status() == "running":
            if time.monotonic() > deadline:
                raise BrokerError(f"container {self._name} still runs 30 s after SIGKILL")
            time.sleep(0.05)

    def log_text(self) -> str | None:
        if self._container is None:
            return None
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
        self._remove_container()
