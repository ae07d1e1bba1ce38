"""ackkit-testkit: the brokers and databases the ackkit test kit starts for a test run.

``ackkit.testing`` (in ackkit itself) has the in-memory broker, the helpers, the
pytest fixtures and the broker of ``AMQP_URL`` (or a testcontainers container when
a Docker engine answers). This distribution adds what starts servers on this
machine, and ``ackkit.testing`` uses it when it is installed. It is not on PyPI (nor
is ackkit): install it from the ``testkit/`` directory of the checkout ackkit came
from, after ackkit (it pins that ackkit's version)::

    pip install /path/to/ackkit/testkit

* a throwaway RabbitMQ node from the machine's ``rabbitmq-server`` (3.10 here),
  with its own data directory, ports, node name and Erlang cookie;
* RabbitMQ 4.0 / 4.3 nodes in a Debian root built once with debootstrap (root);
* a throwaway cluster of such nodes (:func:`own_cluster`, the ``rabbitmq_cluster``
  fixture, ``python -m ackkit_testkit._cluster``): three nodes sharing an Erlang
  cookie, joined, with helpers to kill, stop, start and freeze a node;
* the kit's own Docker image ``ackkit-test/rabbitmq:<version>``, imported from
  such a root for an engine that cannot pull one
  (``python -m ackkit_testkit._docker_image``);
* a throwaway PostgreSQL (the ``postgres`` / ``postgres_dsn`` fixtures): a cluster
  from the machine's server binaries, or a container on a Docker engine, with the
  kit's own image ``ackkit-test/postgres:<version>`` for an engine that cannot pull
  one (``python -m ackkit_testkit._pg_image``).

Nothing here is imported until a test asks for one of these; the fixtures and
``ackkit.testing.provision_broker`` stay the way to get them.
"""

from __future__ import annotations

from typing import Any

from ._cluster import ClusterHandle, QuorumStatus, own_cluster
from ._own import find_rabbitmq_server, own_node
from ._postgres import PostgresHandle, PostgresUnavailable, provision_postgres, wait_postgres

__all__ = [
    "ClusterHandle",
    "PostgresHandle",
    "PostgresUnavailable",
    "QuorumStatus",
    "ensure_local_image",
    "find_rabbitmq_server",
    "own_cluster",
    "own_node",
    "provision_postgres",
    "wait_postgres",
]


def ensure_local_image(client: Any, version: str = "4.3") -> str:
    """Name of the kit's image ``ackkit-test/rabbitmq:<version>`` on the engine of the
    docker ``client``, imported from a Debian root first when it is missing (root)."""
    # imported here: ``python -m ackkit_testkit._docker_image`` runs that module as a script
    from ._docker_image import ensure_local_image as ensure

    return ensure(client, version)
