"""What a broker provider outside this package builds on: ackkit-testkit's own nodes, its
Debian root for 4.x nodes, its Docker image and its throwaway PostgreSQL.

A provider starts something, wraps it in a :class:`~ackkit.testing.BrokerHandle` and
registers it (:func:`register_broker`) so that it is closed at the latest when the process
exits; it raises :class:`~ackkit.testing.BrokerUnavailable` (with
:data:`HOW_TO_GET_A_BROKER`) when it cannot. Those three, ``BrokerError``, ``NodeTLS``
and ``mask_url`` come from :mod:`ackkit.testing` itself; this module holds the rest:

- the environment knobs a provider reads (``ENV_*``, :func:`env_float`,
  :func:`wanted_version`, :data:`DEFAULT_VERSION`, :data:`POSTGRES_MODES`) and where
  ``rabbitmq-server`` is looked for (:data:`SBIN_DIRS`);
- the plugins every node of the kit's own runs (:data:`PLUGINS`);
- running a command with a timeout and checking its exit (:func:`run_command`,
  :func:`check_command`; each run counted for the session's tally, as a node's boot is
  with :func:`count_run`), a free loopback port, whether a pid is alive, masking the
  passwords in a text;
- the Docker engine: whether one answers (:func:`docker_engine`), its client, the kit's
  container and image names, removing the containers of test processes that are gone.

Nothing here starts a broker: the providers ackkit ships (``AMQP_URL``, Docker) live in
:mod:`ackkit.testing`'s private modules and use the same functions.
"""

from ._commands import _check as check_command
from ._commands import _run as run_command
from ._commands import count as count_run
from ._docker_engine import (
    LOCAL_REPOSITORY,
    container_name,
    disable_ryuk,
    docker_client,
    docker_version,
    engine_is_local,
    image_exists,
    local_image_name,
    local_image_version,
    network_mode,
    reap_dead_containers,
)
from ._docker_engine import _docker_engine as docker_engine
from ._env import _SBIN_DIRS as SBIN_DIRS
from ._env import (
    DEFAULT_VERSION,
    ENV_BOOT_TIMEOUT,
    ENV_IMAGE,
    ENV_NODE_DIR,
    ENV_NODE_USER,
    ENV_POSTGRES,
    ENV_POSTGRES_DSN,
    ENV_POSTGRES_IMAGE,
    ENV_SERVER,
    HOW_TO_GET_A_BROKER,
    POSTGRES_MODES,
    wanted_version,
)
from ._env import _env_float as env_float
from ._options import PLUGINS
from ._registry import _register as register_broker
from ._registry import _unregister as unregister_broker
from ._util import free_port, mask_secrets, pid_alive

__all__ = [
    "DEFAULT_VERSION",
    "ENV_BOOT_TIMEOUT",
    "ENV_IMAGE",
    "ENV_NODE_DIR",
    "ENV_NODE_USER",
    "ENV_POSTGRES",
    "ENV_POSTGRES_DSN",
    "ENV_POSTGRES_IMAGE",
    "ENV_SERVER",
    "HOW_TO_GET_A_BROKER",
    "LOCAL_REPOSITORY",
    "PLUGINS",
    "POSTGRES_MODES",
    "SBIN_DIRS",
    "check_command",
    "container_name",
    "count_run",
    "disable_ryuk",
    "docker_client",
    "docker_engine",
    "docker_version",
    "engine_is_local",
    "env_float",
    "free_port",
    "image_exists",
    "local_image_name",
    "local_image_version",
    "mask_secrets",
    "network_mode",
    "pid_alive",
    "reap_dead_containers",
    "register_broker",
    "run_command",
    "unregister_broker",
    "wanted_version",
]
