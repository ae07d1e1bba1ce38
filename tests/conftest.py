"""Shared pytest setup for ackkit's own test suite.

The ackkit test kit (fixtures ``rabbitmq``, ``amqp_url``, ``queue_factory``,
``fresh_queue``, ``own_rabbitmq``) is normally loaded through its ``pytest11``
entry point (the package is installed editable in .venv). When plugin
autoloading is off (PYTEST_DISABLE_PLUGIN_AUTOLOAD=1) it is registered here,
under the same name, so it is never registered twice.
"""

from __future__ import annotations

import importlib
import os
import random
import zlib
from pathlib import Path
from typing import Any

import hypothesis.core
import pytest
from hypothesis import HealthCheck, settings
from hypothesis.database import (
    DirectoryBasedExampleDatabase,
    MultiplexedDatabase,
    ReadOnlyDatabase,
)

# Property tests: `make test` is reproducible, `make fuzz` explores.
#
# - make test: every property test runs with one fixed seed (ACKKIT_HYPOTHESIS_SEED,
#   default below), printed in the session header, so a newcomer's first run draws the
#   same examples as CI's. Examples kept in tests/hypothesis-db (found by fuzz runs,
#   committed) are replayed first.
# - make fuzz (ACKKIT_FUZZ=<factor>): a fresh random seed (printed; rerun it with
#   ACKKIT_HYPOTHESIS_SEED=<seed>), every test's example count times <factor>, and each
#   failing example is saved to tests/hypothesis-db: commit it with the fix (and an
#   @example in the test) and it becomes a regression test of make test.
#
# Property tests check what comes out, not how fast: on a 2-core machine running three
# broker legs side by side an example may take longer than hypothesis's 200 ms default
# (a DeadlineExceeded there says nothing about the code under test).
FIXED_SEED = 20261126
REGRESSIONS = Path(__file__).parent / "hypothesis-db"
FUZZ = int(os.environ.get("ACKKIT_FUZZ") or 0)
_seed_env = os.environ.get("ACKKIT_HYPOTHESIS_SEED")
SEED = (
    int(_seed_env)
    if _seed_env
    else (random.SystemRandom().randrange(2**32) if FUZZ else FIXED_SEED)
)

_local = DirectoryBasedExampleDatabase(".hypothesis/examples")
_kept = DirectoryBasedExampleDatabase(str(REGRESSIONS))
settings.register_profile(
    "ackkit",
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    database=MultiplexedDatabase(_local, ReadOnlyDatabase(_kept)),
)
settings.register_profile(
    "ackkit-fuzz",
    parent=settings.get_profile("ackkit"),
    max_examples=100 * max(FUZZ, 1),
    database=MultiplexedDatabase(_local, _kept),
)
settings.load_profile("ackkit-fuzz" if FUZZ else "ackkit")
hypothesis.core.global_force_seed = SEED  # a --hypothesis-seed given to pytest wins


def pytest_report_header(config: pytest.Config) -> str:
    mode = f"fuzz x{FUZZ}, fresh seed" if FUZZ else "fixed seed"
    return (
        f"ackkit property tests: seed {SEED} ({mode}); "
        f"rerun with ACKKIT_HYPOTHESIS_SEED={SEED}{f' ACKKIT_FUZZ={FUZZ}' if FUZZ else ''}"
    )


# The contract and adversarial suites run each test on a real RabbitMQ and on the kit's
# in-memory broker (the `transport` / `version_transport` parameters). The in-memory runs
# do not depend on the leg's broker: with ACKKIT_TEST_IN_MEMORY=0 a leg leaves them out
# (make test's 4.3 leg: the 3.10 leg runs them).
IN_MEMORY = os.environ.get("ACKKIT_TEST_IN_MEMORY", "1") != "0"
_MEMORY_TRANSPORTS = frozenset({"memory", "memory-4.3"})


def _in_memory_transport(item: pytest.Item) -> bool:
    params = getattr(getattr(item, "callspec", None), "params", {})
    return any(
        params.get(name) in _MEMORY_TRANSPORTS for name in ("transport", "version_transport")
    )


# Most broker tests run on both runtimes (App and AsyncApp). make test's two broker legs
# share them out: with ACKKIT_TEST_RUNTIMES=pick:0 (the 3.10 leg) and pick:1 (the 4.3 leg)
# each such test runs on one runtime per leg, the other runtime on the other leg, picked by
# the test's name and its other parameters (stable from run to run, each runtime about
# half the time; the App over AMQP 1.0, the contract suite's third runtime, on the 4.3
# leg only: it needs RabbitMQ 4.0+). Together the legs still run every test on both
# runtimes and on both brokers. The contract suite is shared out the same way (its
# in-memory broker's runs, which one leg runs alone, are not; the Docker leg runs both
# runtimes on a container).
# A test marked `legs_share("name")` shares out its parameter `name` instead (each value
# on one leg; the test's other parameters meet every value across the legs), one marked
# `legs_share()` its runs in their order (for runs that already pair the runtime with
# another parameter, as the alarm tests do). A test marked `one_leg` (its subject is not
# the broker's version: the inbox's database, the DLQ tools, publishing shapes) runs each
# run the legs do not already share out on one leg only, picked by its node id: the pair
# of legs runs it once, on one broker or the other. Only the modules under
# ACKKIT_TEST_PAIRED (the suites both legs run) are shared out, but for those in
# ACKKIT_TEST_UNPAIRED (those one leg runs alone). Unset (a plain pytest run, make
# test-matrix): every run everywhere.
_PICK = os.environ.get("ACKKIT_TEST_RUNTIMES", "both")
PICK = int(_PICK.removeprefix("pick:")) if _PICK.startswith("pick:") else None
_PAIRED = tuple(os.environ.get("ACKKIT_TEST_PAIRED", "tests/").split())
_UNPAIRED = tuple(os.environ.get("ACKKIT_TEST_UNPAIRED", "").split())
_RUNTIME_PARAMS = ("runtime", "kind", "cls")  # the names the suites give the runtime
_RUNTIME_VALUES = {"sync": 0, "App": 0, "async": 1, "AsyncApp": 1}
_EVERY_RUN = "*"  # legs_share() without a name: the test's runs, in their order


def _plain(value: Any) -> Any:
    """A parameter's value as a key that is the same in every process."""
    return value if isinstance(value, str | int | float | bool | None) else type(value).__name__


def _shared_param(item: pytest.Item) -> str | None:
    """The parameter the broker legs share out for `item`, if any."""
    path = item.nodeid.split("::", 1)[0]
    callspec = getattr(item, "callspec", None)
    if callspec is None or not path.startswith(_PAIRED) or _in_memory_transport(item):
        return None
    if _UNPAIRED and path.startswith(_UNPAIRED):
        return None
    marker = item.get_closest_marker("legs_share")
    if marker is not None:
        if not marker.args:
            return _EVERY_RUN
        name = str(marker.args[0])
        return name if name in callspec.params else None
    runtime = [n for n in _RUNTIME_PARAMS if callspec.params.get(n) in _RUNTIME_VALUES]
    return runtime[0] if len(runtime) == 1 else None


def _amqp10(item: pytest.Item) -> bool:
    """A run on the App over AMQP 1.0 (the contract suite's `amqp10` runtime)."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    return any(params.get(n) == "amqp10" for n in _RUNTIME_PARAMS)


def _one_leg(item: pytest.Item) -> bool:
    """`item` is marked `one_leg` in a suite both broker legs run (not one a leg runs
    alone): it runs on one leg only."""
    path = item.nodeid.split("::", 1)[0]
    if not path.startswith(_PAIRED) or _in_memory_transport(item):
        return False
    if _UNPAIRED and path.startswith(_UNPAIRED):
        return False
    return item.get_closest_marker("one_leg") is not None


def _left_to_the_other_leg(items: list[pytest.Item]) -> set[str]:
    """The node ids this leg leaves to the other: in each group of runs of one test that
    differ only in the shared parameter, the values alternate between the legs; a run of
    a `one_leg` test that is not shared out that way goes to the leg its node id picks."""
    groups: dict[tuple[Any, ...], list[Any]] = {}
    shared = []
    gone = set()
    for item in items:
        if _amqp10(item) and not _in_memory_transport(item):  # RabbitMQ 4.0+: the 4.3 leg
            if PICK != 1:
                gone.add(item.nodeid)
            continue
        name = _shared_param(item)
        if name is None:
            if _one_leg(item) and (zlib.crc32(item.nodeid.encode()) + (PICK or 0)) % 2:
                gone.add(item.nodeid)
            continue
        params = item.callspec.params  # type: ignore[attr-defined]
        if name == _EVERY_RUN:  # the test's runs alternate, whatever their parameters
            others: tuple[Any, ...] = ()
            value: Any = tuple(sorted((n, _plain(v)) for n, v in params.items()))
        else:
            others = tuple(sorted((n, _plain(v)) for n, v in params.items() if n != name))
            value = _plain(params[name])
        key = (item.nodeid.split("::", 1)[0], getattr(item, "originalname", item.name), others)
        values = groups.setdefault(key, [])
        if value not in values:
            values.append(value)
        index = _RUNTIME_VALUES[value] if name in _RUNTIME_PARAMS else None
        shared.append((item, key, value, index))
    for item, key, value, index in shared:
        i = groups[key].index(value) if index is None else index
        if (zlib.crc32(repr(key).encode()) + i + (PICK or 0)) % 2:
            gone.add(item.nodeid)
    return gone


def _leave_out(config: pytest.Config, items: list[pytest.Item], why: Any) -> None:
    gone = [item for item in items if why(item)]
    if gone:
        config.hook.pytest_deselected(items=gone)
        items[:] = [item for item in items if not why(item)]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Leave out the runs a leg says it does not need (above); in fuzz mode, tests that set
    their own max_examples get FUZZ times as many too."""
    if not IN_MEMORY:
        _leave_out(config, items, _in_memory_transport)
    if PICK is not None:
        other_leg = _left_to_the_other_leg(items)
        _leave_out(config, items, lambda item: item.nodeid in other_leg)
    if not FUZZ:
        return
    for item in items:
        fn = getattr(getattr(item, "obj", None), "__func__", getattr(item, "obj", None))
        own = getattr(fn, "_hypothesis_internal_use_settings", None)
        if own is None or not getattr(fn, "is_hypothesis_test", False):
            continue
        fn._hypothesis_internal_use_settings = settings(  # type: ignore[union-attr]
            own, max_examples=own.max_examples * FUZZ, database=settings.default.database
        )


def pytest_configure(config: pytest.Config) -> None:
    plugin = importlib.import_module("ackkit.testing.plugin")
    if not config.pluginmanager.is_registered(plugin) and not config.pluginmanager.is_blocked(
        "ackkit"
    ):
        config.pluginmanager.register(plugin, "ackkit")


@pytest.fixture(scope="session")
def stream_broker() -> Any:
    """A throwaway node of the kit's own with the stream plugin (``handle.stream_port``),
    of this leg's RabbitMQ version (``ACKKIT_TEST_RABBITMQ``): booted on first use, so only
    the streams tests pay for it; super streams need 3.11+ (the 4.3 leg). AMQP_URL is not
    used: its broker may not run the plugin."""
    from ackkit.testing import BrokerUnavailable
    from ackkit.testing._env import wanted_version

    testkit = pytest.importorskip("ackkit_testkit")
    pytest.importorskip("rstream")
    try:
        node = testkit.own_node(wanted_version(), streams=True)
    except BrokerUnavailable as exc:
        if not os.environ.get("AMQP_URL"):
            raise
        pytest.skip(f"the streams tests need a node of the kit's own: {exc}")
    try:
        yield node
    finally:
        node.close()
