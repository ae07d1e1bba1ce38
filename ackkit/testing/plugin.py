"""pytest plugin of the ackkit test kit.

Loaded automatically through the ``pytest11`` entry point when ackkit is
installed. With plugin autoloading disabled (``PYTEST_DISABLE_PLUGIN_AUTOLOAD``),
enable it in a top-level conftest.py with::

    pytest_plugins = ["ackkit.testing.plugin"]

(harmless when the entry point already loaded it).

Fixtures:

``rabbitmq``       session-scoped :class:`~ackkit.testing.BrokerHandle` (``provision_broker()``)
``amqp_url``       its AMQP URL
``queue_factory``  ``queue_factory(tag="", *, declare=False, ...) -> str``: unique queue
                   names ``t.<test>.<rand>``; the queues, their ``<name>.*`` companions
                   (``.dlq``, ``.retry.*``) and ``<name>*`` exchanges are deleted after the test
``fresh_queue``    one such name (nothing declared)
``own_rabbitmq``   a broker node of the kit's own that the test may stop, restart or kill;
                   one per test module, running again at the start of every test. Skipped
                   (with the reason) only when ``AMQP_URL`` / ``ACKKIT_TEST_BROKER=url``
                   forces an external broker.
``rabbitmq_cluster``  a throwaway 3-node RabbitMQ cluster of the kit's own (ackkit-testkit's
                   ``ClusterHandle``: ``urls``, ``nodes``, ``kill(i)``, ``stop(i)``,
                   ``start(i)``, ``freeze(i)``, ``running_nodes()``, ``quorum_status(q)``),
                   of the version ``--rabbitmq`` asks for (or a module's own
                   ``rabbitmq_cluster_version`` fixture); one per test module, every node
                   running and joined at the start of every test. ``AMQP_URL`` does not
                   change it (the kit's own nodes, always); skipped only when no node of the
                   kit's own can start while ``AMQP_URL`` is set
``rabbitmq_version``  the session broker's version as it announces itself ("4.3.6")
``amqp_broker``    ``memory_broker``, or ``rabbitmq`` with ``--real-broker`` /
                   ``ACKKIT_TEST_REAL_BROKER=1``: one test suite, both brokers
``postgres``, ``postgres_dsn``  a PostgreSQL (``ACKKIT_TEST_POSTGRES_DSN``, or a throwaway
                   cluster or container of ackkit-testkit's; ``ACKKIT_TEST_POSTGRES=
                   auto|dsn|own|docker``) and a fresh database on it per test
``memory_broker``  a fresh :class:`~ackkit.testing.InMemoryBroker` for the test (no
                   network); ``App(memory_broker.url)`` runs on it. It follows RabbitMQ
                   3.13's rules, or those of the version ``--rabbitmq`` /
                   ``ACKKIT_TEST_RABBITMQ`` names (3.10: 3.13's, 4.0, 4.3)

Which RabbitMQ: ``--rabbitmq=3.10|4.0|4.3`` (or ``ACKKIT_TEST_RABBITMQ``) picks the
version of the kit's own brokers (3.10, the default, is the machine's own
``rabbitmq-server``; 4.x runs in a Debian root built on first use, as root; both
come with ackkit-testkit: ``pip install /path/to/ackkit/testkit``). With
``AMQP_URL`` set, that broker is used whatever its version. A test marked
``@pytest.mark.rabbitmq(min="4.0")`` / ``(max="3.13")`` / ``("4.3", "4.0")`` is
skipped, with the reason, on a broker of another version.

Everything else is configured through environment variables (see ``ackkit.testing``).
"""

from __future__ import annotations

import logging
import os
import re
import secrets
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from ._broker import provision_broker
from ._env import ENV_MODE, ENV_URL, ENV_VERSION, VERSIONS, wanted_version
from ._errors import BrokerError, BrokerUnavailable
from ._handle import BrokerHandle
from ._memory import InMemoryBroker
from ._pg import fresh_database, provision_postgres
from ._util import mask_url

ENV_REAL = "ACKKIT_TEST_REAL_BROKER"

__all__ = [
    "QueueFactory",
    "amqp_broker",
    "amqp_url",
    "fresh_queue",
    "memory_broker",
    "own_rabbitmq",
    "postgres",
    "postgres_dsn",
    "queue_factory",
    "rabbitmq",
    "rabbitmq_cluster",
    "rabbitmq_cluster_version",
    "rabbitmq_version",
]

log = logging.getLogger("ackkit.testing")

MARKERS = {
    "integration": "needs a real RabbitMQ broker",
    "contract": "behaviour contract run on every runtime against a real broker",
    "chaos": "fault injection on a broker node the suite owns",
    "spark": "needs a local Spark (pyspark + Java)",
    "bench": "benchmarks, never part of the normal test run",
    "rabbitmq": "rabbitmq(*series, min=, max=): run only on brokers of these RabbitMQ versions",
    "ttl_scale": "ttl_scale(factor): the in-memory broker multiplies message TTLs (retry delays) "
    "by factor; 0 hands retries back at once",
}


class _LoadedUnderAnotherName:
    """Placeholder registered under this module's name once the module itself is
    registered under another one (the entry point's "ackkit"), so that
    ``pytest_plugins = ["ackkit.testing.plugin"]`` is then a no-op rather than
    pytest's "Plugin already registered under a different name" error."""


def pytest_plugin_registered(plugin: object, manager: pytest.PytestPluginManager) -> None:
    if plugin is not sys.modules[__name__]:
        return
    for alias in (__name__, "ackkit"):
        if manager.get_plugin(alias) is None and not manager.is_blocked(alias):
            manager.register(_LoadedUnderAnotherName(), alias)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("ackkit", "ackkit test kit")
    group.addoption(
        "--rabbitmq",
        default=None,
        metavar="VERSION",
        help=f"RabbitMQ version of the kit's own brokers: {' | '.join(VERSIONS)} "
        f"(sets {ENV_VERSION}; 3.10 is the machine's rabbitmq-server, 4.x a node in a "
        "Debian root built on first use)",
    )
    group.addoption(
        "--real-broker",
        action="store_true",
        default=False,
        help=f"the amqp_broker fixture gives the real RabbitMQ (as {ENV_REAL}=1 does) "
        "instead of an in-memory broker",
    )
    group.addoption(
        "--ttl-scale",
        type=float,
        default=None,
        metavar="FACTOR",
        help="the in-memory brokers (memory_broker, amqp_broker) multiply message TTLs, "
        "retry delays included, by FACTOR (0: at once); a test's ttl_scale marker wins",
    )


def pytest_configure(config: pytest.Config) -> None:
    chosen = config.getoption("--rabbitmq", default=None)
    if chosen:
        try:
            version = wanted_version(chosen)
        except ValueError as exc:
            raise pytest.UsageError(f"--rabbitmq: {exc}") from None
        # The environment, so subprocesses (workers, chaos, Spark) pick it up too.
        os.environ[ENV_VERSION] = version
    registered = {
        re.split(r"[:(]", line, maxsplit=1)[0].strip() for line in config.getini("markers")
    }
    for name, description in MARKERS.items():
        if name not in registered:
            config.addinivalue_line("markers", f"{name}: {description}")


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """What the kit's commands cost this session: rabbitmqctl runs (an Erlang VM each),
    erl_call runs and node boots, and the tests that spent the most on them."""
    from ._commands import spent_lines

    lines = spent_lines()
    if lines:
        terminalreporter.section("ackkit test kit: broker commands")
        for line in lines:
            terminalreporter.write_line(line)


def pytest_report_header(config: pytest.Config) -> str:
    url = os.environ.get(ENV_URL, "").strip()
    mode = os.environ.get(ENV_MODE, "").strip() or "auto"
    where = f"{ENV_URL}={mask_url(url)}" if url else f"{ENV_URL} not set"
    try:
        version = wanted_version()
    except ValueError as exc:
        version = str(exc)
    if url and mode in ("auto", "url"):
        version += " (not used: the AMQP_URL broker is whatever it is)"
    return f"ackkit test broker: mode={mode}, {where}, own nodes: RabbitMQ {version}"


def _external_broker_forced() -> str | None:
    mode = os.environ.get(ENV_MODE, "").strip().lower()
    url = os.environ.get(ENV_URL, "").strip()
    if mode == "url":
        return f"{ENV_MODE}=url forces the external broker of {ENV_URL}"
    if url and mode in ("", "auto"):
        return f"{ENV_URL}={mask_url(url)} forces an external broker"
    return None


@pytest.fixture(scope="session")
def rabbitmq() -> Iterator[BrokerHandle]:
    """The session's broker (AMQP_URL, a Docker container or a throwaway node)."""
    with provision_broker() as broker:
        yield broker


def _memory_rabbitmq() -> str | None:
    """The RabbitMQ version the in-memory fixtures follow: the one ``--rabbitmq`` /
    ``ACKKIT_TEST_RABBITMQ`` asks the kit's own brokers for, so that one option runs a
    suite on the same version's rules whichever broker it gets; None (3.13) if unset."""
    if not os.environ.get(ENV_VERSION, "").strip():
        return None
    return wanted_version()


@pytest.fixture
def memory_broker(request: pytest.FixtureRequest) -> Iterator[InMemoryBroker]:
    """A fresh in-memory broker for this test (``App(memory_broker.url)``), closed after it."""
    with InMemoryBroker(rabbitmq=_memory_rabbitmq(), ttl_scale=_ttl_scale(request)) as broker:
        yield broker


def _ttl_scale(request: pytest.FixtureRequest) -> float:
    """The test's ``@pytest.mark.ttl_scale(factor)`` (the closest one: test, class,
    module), else ``--ttl-scale``, else 1 (retry delays wait for real). A real broker's
    delays are always real: this reaches the in-memory brokers only."""
    marker = request.node.get_closest_marker("ttl_scale")
    if marker is not None:
        if len(marker.args) != 1 or marker.kwargs:
            raise pytest.UsageError("use @pytest.mark.ttl_scale(factor), e.g. ttl_scale(0)")
        value = marker.args[0]
    else:
        value = request.config.getoption("--ttl-scale", default=None)
    if value is None:
        return 1.0
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
        raise pytest.UsageError(f"ttl_scale must be a number >= 0, got {value!r}")
    return float(value)


def _real_broker_wanted(config: pytest.Config) -> bool:
    env = os.environ.get(ENV_REAL, "").strip().lower()
    return bool(config.getoption("--real-broker", default=False)) or env in ("1", "true", "yes")


@pytest.fixture
def amqp_broker(request: pytest.FixtureRequest) -> Iterator[BrokerHandle]:
    """The broker a service's tests run on: a fresh in-memory broker, or the session's
    real RabbitMQ with ``--real-broker`` (or ``ACKKIT_TEST_REAL_BROKER=1``): the same
    tests, fast by default and against RabbitMQ when asked."""
    if _real_broker_wanted(request.config):
        yield request.getfixturevalue("rabbitmq")
        return
    with InMemoryBroker(rabbitmq=_memory_rabbitmq(), ttl_scale=_ttl_scale(request)) as broker:
        yield broker


@pytest.fixture(scope="session")
def rabbitmq_version(rabbitmq: BrokerHandle) -> str:
    """The session broker's version as it announces itself, e.g. "4.3.6"."""
    return rabbitmq.server_version()


def _series(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text)[:2])


def _version_skip_reason(marker: pytest.Mark, version: str) -> str | None:
    have = _series(version)
    wanted = [_series(str(v)) for v in marker.args]
    low, high = marker.kwargs.get("min"), marker.kwargs.get("max")
    if wanted and have not in wanted:
        return f"needs RabbitMQ {' or '.join(map(str, marker.args))}; the broker is {version}"
    if low is not None and have < _series(str(low)):
        return f"needs RabbitMQ {low} or newer; the broker is {version}"
    if high is not None and have > _series(str(high)):
        return f"needs RabbitMQ {high} or older; the broker is {version}"
    return None


@pytest.fixture(autouse=True)
def _ackkit_rabbitmq_marker(request: pytest.FixtureRequest) -> None:
    marker = request.node.get_closest_marker("rabbitmq")
    if marker is None:
        return
    reason = _version_skip_reason(marker, request.getfixturevalue("rabbitmq_version"))
    if reason is not None:
        pytest.skip(reason)


@pytest.fixture(scope="session")
def amqp_url(rabbitmq: BrokerHandle) -> str:
    """AMQP URL of the session's broker (contains the password; log ``mask_url(url)``)."""
    return rabbitmq.url


@pytest.fixture(scope="module")
def _ackkit_own_node() -> Iterator[BrokerHandle]:
    reason = _external_broker_forced()
    if reason is not None:
        pytest.skip(f"needs a broker node the test kit owns (to stop/restart/kill it); {reason}")
    with provision_broker(exclusive=True) as broker:
        yield broker


@pytest.fixture
def own_rabbitmq(_ackkit_own_node: BrokerHandle) -> BrokerHandle:
    """A node of the kit's own that the test may stop/restart/kill; running at test start."""
    _ackkit_own_node.start()
    return _ackkit_own_node


@pytest.fixture(scope="module")
def rabbitmq_cluster_version() -> str:
    """The RabbitMQ version of the ``rabbitmq_cluster`` fixture's nodes: the one
    ``--rabbitmq`` / ``ACKKIT_TEST_RABBITMQ`` asks for. Override it (a module-scoped
    fixture of that name, e.g. with ``params=["3.10", "4.3"]``) to pick others."""
    return wanted_version()


@pytest.fixture(scope="session")
def _ackkit_clusters() -> Iterator[dict[str, Any]]:
    """The kit's clusters of this test session, one per RabbitMQ version, started by the
    first module that wants one and shared by the others (a start is about a minute:
    the nodes boot and join); stopped at the end of the session."""
    clusters: dict[str, Any] = {}
    try:
        yield clusters
    finally:
        for cluster in clusters.values():
            cluster.close()


@pytest.fixture(scope="module")
def _ackkit_own_cluster(rabbitmq_cluster_version: str, _ackkit_clusters: dict[str, Any]) -> Any:
    cluster = _ackkit_clusters.get(rabbitmq_cluster_version)
    if cluster is not None and not cluster.closed:
        return cluster
    from ._kit import require

    kit = require("a RabbitMQ cluster of the kit's own")
    try:
        cluster = kit.own_cluster(rabbitmq_cluster_version)
    except BrokerUnavailable as exc:
        if not os.environ.get(ENV_URL, "").strip():
            raise
        pytest.skip(f"a cluster needs nodes of the kit's own: {exc}")
    _ackkit_clusters[rabbitmq_cluster_version] = cluster
    return cluster


@pytest.fixture
def rabbitmq_cluster(_ackkit_own_cluster: Any) -> Any:
    """A 3-node cluster of the kit's own the test may kill, stop, start and freeze nodes
    of; every node running and reporting all of them at the start of the test. One
    cluster per RabbitMQ version serves the whole test session: what a test declares
    stays for the next, so name queues after the test."""
    cluster = _ackkit_own_cluster
    cluster.start()  # resumes frozen nodes, boots stopped ones
    cluster.wait_running()
    stale = cluster.partitions()
    if stale:
        # A partition a node still records after the nodes run together again (3.10,
        # after a freeze): restarting the node clears it, as RabbitMQ's docs advise.
        log.warning("restarting cluster nodes that record a partition: %s", stale)
        for name in stale:
            cluster.restart(cluster.index_of(name))
            cluster.wait_running()
    return cluster


def _slug(text: str, limit: int = 60) -> str:
    slug = re.sub(r"[^A-Za-z0-9_-]+", "_", text).strip("_")
    return slug[:limit] or "test"


class QueueFactory:
    """Hands out unique queue names for one test and deletes them afterwards."""

    def __init__(self, request: pytest.FixtureRequest) -> None:
        self._request = request
        self._test = _slug(request.node.name)
        self._made: list[tuple[BrokerHandle, str]] = []

    def __call__(
        self,
        tag: str = "",
        *,
        declare: bool = False,
        durable: bool = True,
        arguments: dict[str, Any] | None = None,
        broker: BrokerHandle | None = None,
    ) -> str:
        """A new queue name ``t.<test>[.<tag>].<rand>``.

        ``declare=True`` declares it as a classic queue (durable unless
        ``durable=False``) with the extra ``arguments``. ``broker`` defaults to
        the session's ``rabbitmq`` fixture.
        """
        if broker is None:
            broker = self._request.getfixturevalue("rabbitmq")
        parts = ["t", self._test, *([_slug(tag, 40)] if tag else []), secrets.token_hex(3)]
        name = ".".join(parts)
        self._made.append((broker, name))
        if declare:
            args = {"x-queue-type": "classic", **(arguments or {})}
            conn = broker.connect()
            try:
                conn.channel().queue_declare(name, durable=durable, arguments=args)
            finally:
                conn.close()
        return name

    @property
    def names(self) -> list[str]:
        return [name for _, name in self._made]

    def cleanup(self) -> None:
        by_broker: dict[int, tuple[BrokerHandle, list[str]]] = {}
        for broker, name in self._made:
            by_broker.setdefault(id(broker), (broker, []))[1].append(name)
        self._made.clear()
        for broker, names in by_broker.values():
            if broker.closed or (broker.own and not broker.is_running()):
                continue
            try:
                _delete_with_companions(broker, names)
            except Exception as exc:  # cleanup must not hide the test's own outcome
                log.warning("could not delete test queues %s on %r: %s", names, broker, exc)


def _related(name: str, candidates: list[str]) -> list[str]:
    return [c for c in candidates if c == name or c.startswith(name + ".")]


def _delete_with_companions(broker: BrokerHandle, names: list[str]) -> None:
    try:
        queues = broker.queue_names()
        exchanges = broker.exchange_names()
    except BrokerError:
        # No listing possible (e.g. a remote AMQP_URL broker): delete the usual names.
        queues, exchanges = [], []
        for name in names:
            queues += [name, f"{name}.dlq", f"{name}.retry"]
            exchanges += [name, f"{name}.dlx", f"{name}.retry"]
    doomed_q = sorted({q for n in names for q in _related(n, queues)})
    doomed_x = sorted({x for n in names for x in _related(n, exchanges)})
    broker.delete_many(doomed_q, doomed_x)


@pytest.fixture
def queue_factory(request: pytest.FixtureRequest) -> Iterator[QueueFactory]:
    """``queue_factory(tag="", *, declare=False, durable=True, arguments=None, broker=None)``
    returns unique queue names; they and their companions are deleted after the test."""
    factory = QueueFactory(request)
    yield factory
    factory.cleanup()


@pytest.fixture
def fresh_queue(queue_factory: QueueFactory) -> str:
    """A unique queue name for this test (not declared; deleted afterwards)."""
    return queue_factory()


# -- PostgreSQL, for the inbox ------------------------------------------------------------


@pytest.fixture(scope="session")
def postgres() -> Iterator[Any]:
    """A session-scoped PostgreSQL (``.dsn``): ``ACKKIT_TEST_POSTGRES_DSN``, or a throwaway
    server of ackkit-testkit's, a cluster made with the machine's PostgreSQL binaries or
    a container on a Docker engine (``ACKKIT_TEST_POSTGRES``; 127.0.0.1, a free port;
    stopped and deleted at the end)."""
    h = provision_postgres()
    try:
        yield h
    finally:
        h.close()


@pytest.fixture
def postgres_dsn(postgres: Any, request: pytest.FixtureRequest) -> Iterator[str]:
    """The DSN of a fresh database for this test (dropped afterwards)."""
    slug = _slug(request.node.name, 40).replace(".", "_").replace("-", "_")
    yield from fresh_database(postgres.dsn, slug)
