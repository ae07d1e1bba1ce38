"""The environment variables the test kit reads, their defaults, and what it
tells someone who has no broker."""

from __future__ import annotations

import os

ENV_URL = "AMQP_URL"
ENV_MODE = "ACKKIT_TEST_BROKER"  # auto | url | docker | own
ENV_IMAGE = "ACKKIT_TEST_RABBITMQ_IMAGE"  # docker image, default below
ENV_DOCKER_NETWORK = "ACKKIT_TEST_DOCKER_NETWORK"  # auto | host | bridge
ENV_SERVER = "ACKKIT_RABBITMQ_SERVER"  # explicit path of the rabbitmq-server script
ENV_NODE = "ACKKIT_TEST_NODE"  # node name rabbitmqctl should use for AMQP_URL brokers
ENV_NODE_USER = "ACKKIT_TEST_NODE_USER"  # user an own node runs as when we are root
ENV_NODE_DIR = "ACKKIT_TEST_NODE_DIR"  # parent directory of own nodes' data directories
ENV_BOOT_TIMEOUT = "ACKKIT_TEST_BOOT_TIMEOUT"  # seconds, default 60
ENV_VERSION = "ACKKIT_TEST_RABBITMQ"  # 3.10 | 4.0 | 4.3: version of the kit's own brokers
ENV_POSTGRES_DSN = "ACKKIT_TEST_POSTGRES_DSN"  # a PostgreSQL the tests may use
ENV_POSTGRES = "ACKKIT_TEST_POSTGRES"  # auto | dsn | own | docker: where PostgreSQL comes from
ENV_POSTGRES_IMAGE = "ACKKIT_TEST_POSTGRES_IMAGE"  # the image of the Docker way
POSTGRES_MODES = ("auto", "dsn", "own", "docker")

DEFAULT_VERSION = "3.10"  # the machine's own rabbitmq-server
VERSIONS = ("3.10", "4.0", "4.3")

# The Docker way runs RabbitMQ 4.3 unless ACKKIT_TEST_RABBITMQ asks for another 4.x:
# the official image rabbitmq:<version> (pulled when missing), or on an engine without
# a bridge network the kit's own ackkit-test/rabbitmq:<version> (built from a Debian root).
DOCKER_DEFAULT_VERSION = "4.3"
DEFAULT_IMAGE = f"rabbitmq:{DOCKER_DEFAULT_VERSION}"
MODES = ("auto", "url", "docker", "own")

_SBIN_DIRS = (
    "/usr/sbin",
    "/usr/local/sbin",
    "/sbin",
    "/opt/homebrew/sbin",
    "/usr/lib/rabbitmq/bin",
)

HOW_TO_GET_A_BROKER = """\
How to get a broker for the tests (any one of):
  * point the tests at a running broker:  export AMQP_URL=amqp://guest:guest@127.0.0.1:5672/%2f
  * start a Docker engine (with testcontainers installed, the kit runs the rabbitmq:4.3 image)
  * let the kit start throwaway nodes of its own: pip install /path/to/ackkit/testkit
    (ackkit-testkit, from ackkit's checkout: it is not on PyPI), and install the RabbitMQ
    server:
        sudo apt-get update && sudo apt-get install -y rabbitmq-server   (Debian/Ubuntu)
        brew install rabbitmq                                           (macOS)
Force one way with ACKKIT_TEST_BROKER=url|docker|own."""


def _env_float(name: str, default: float) -> float:
    """The number in the environment variable `name`, `default` when it is unset or blank;
    a ValueError naming it when it is not a number."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        return float(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a number") from None


def wanted_version(explicit: str | None = None) -> str:
    """The RabbitMQ version asked for (argument, else ``$ACKKIT_TEST_RABBITMQ``, else 3.10)."""
    raw = (explicit or os.environ.get(ENV_VERSION, "")).strip().lower()
    if raw in ("", "system", "3", "3.10"):
        return DEFAULT_VERSION
    if raw in ("4", "4.3"):
        return "4.3"
    if raw in VERSIONS:
        return raw
    source = "rabbitmq=" if explicit else f"{ENV_VERSION}="
    raise ValueError(f"{source}{raw!r}: the kit's own brokers are one of {', '.join(VERSIONS)}")
