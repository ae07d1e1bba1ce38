"""Test kit: a broker for ackkit's tests and for users' own suites, in memory or real.

    from ackkit.testing import InMemoryBroker

    with InMemoryBroker() as broker:     # in this process: no network, no node
        app = App(broker.url)           # memory://...: the whole of ackkit runs on it
        broker.publish("orders", {"id": 1})
        broker.wait_for("orders", ready=0, unacked=0)
        broker.dead_letters("orders.dlq")

A real RabbitMQ, with the same helpers (publish, messages, dead_letters,
wait_for, wait_for_async):

    from ackkit.testing import provision_broker

    with provision_broker() as broker:
        broker.url                      # amqp://guest:guest@127.0.0.1:<port>/%2f
        broker.counts("orders")         # QueueCounts(ready, unacked, total, consumers)
        broker.wait_for("orders", ready=0, unacked=0)
        broker.restart()                # only when broker.own

Where the broker comes from (first that applies):

1. ``AMQP_URL`` is set: that broker (``own=False``; counts through rabbitmqctl
   when it runs on this machine, ``ACKKIT_TEST_NODE`` names its node otherwise).
2. A Docker engine answers: a RabbitMQ container via testcontainers
   (image ``ACKKIT_TEST_RABBITMQ_IMAGE``, default ``rabbitmq:4.3``; on an engine
   without a bridge network the container shares the host's network and binds
   to 127.0.0.1 on ports of its own, see ``ACKKIT_TEST_DOCKER_NETWORK``).
3. ackkit-testkit is installed (a distribution of its own, not on PyPI: the
   ``testkit/`` directory of ackkit's checkout, ``pip install /path/to/ackkit/testkit``)
   and ``rabbitmq-server`` is: a throwaway node with its own data directory, ports,
   node name and Erlang cookie, removed on exit.
4. Otherwise :class:`BrokerUnavailable`, saying how to get a broker (without
   ackkit-testkit: ``pip install /path/to/ackkit/testkit``, or set ``AMQP_URL``).

The kit's own nodes (3), the 4.x nodes in a Debian root, the kit's Docker image
for an engine that cannot pull one and the ``postgres`` fixture's throwaway
PostgreSQL all come with ackkit-testkit; this package keeps the in-memory broker,
the helpers, :class:`BrokerHandle`, the fixtures, the ``AMQP_URL`` broker and the
testcontainers one.

The kit's own brokers (2 and 3) run the ``rabbitmq_consistent_hash_exchange``
plugin (so ``x-consistent-hash`` shard layouts work on every version), instead
of an image's own list of plugins.

Environment knobs: ``ACKKIT_TEST_BROKER=auto|url|docker|own`` forces a way;
``ACKKIT_RABBITMQ_SERVER`` is the rabbitmq-server script to use;
``ACKKIT_TEST_BOOT_TIMEOUT`` (seconds, default 60); ``ACKKIT_TEST_NODE_DIR``
(parent of node data directories); ``ACKKIT_TEST_NODE_USER`` (user a node runs
as when the tests run as root; default ``rabbitmq``);
``ACKKIT_TEST_RABBITMQ=3.10|4.0|4.3`` the version of the kit's own nodes (3.10,
the default, is the machine's ``rabbitmq-server``; 4.x nodes run in a Debian root
built once, as root, under ``ACKKIT_ROOTFS_DIR``, default /var/cache/ackkit/rootfs;
both need ackkit-testkit). The ``postgres`` fixture's server:
``ACKKIT_TEST_POSTGRES_DSN``, else ``ACKKIT_TEST_POSTGRES=auto|dsn|own|docker``
(auto: the DSN, else the machine's server binaries, else a container, image
``ACKKIT_TEST_POSTGRES_IMAGE``).

The pytest fixtures (``rabbitmq``, ``amqp_url``, ``queue_factory``,
``fresh_queue``, ``own_rabbitmq``, ``rabbitmq_cluster``) live in :mod:`ackkit.testing.plugin`, which
pytest loads automatically once ackkit is installed.

What a broker provider outside this package (ackkit-testkit) builds on besides the
names below (the environment knobs, running commands, the Docker engine, registering a
started broker for closing at exit) is in :mod:`ackkit.testing.providers`; the test
kit imports nothing else of this package.
"""

from ._broker import provision_broker
from ._errors import BrokerError, BrokerNotOwned, BrokerUnavailable, QueueNotFound
from ._handle import BrokerHandle
from ._helpers import NotRouted, QueuedMessage, wait_until, wait_until_async
from ._memory import InMemoryBroker
from ._options import NodeTLS
from ._queries import DeclaredQueue, QueueCounts
from ._util import mask_url

__all__ = [
    "BrokerError",
    "BrokerHandle",
    "BrokerNotOwned",
    "BrokerUnavailable",
    "DeclaredQueue",
    "InMemoryBroker",
    "NodeTLS",
    "NotRouted",
    "QueueCounts",
    "QueueNotFound",
    "QueuedMessage",
    "mask_url",
    "provision_broker",
    "wait_until",
    "wait_until_async",
]
