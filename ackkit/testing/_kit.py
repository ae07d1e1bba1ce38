"""The kit's own brokers and PostgreSQL come with a distribution of their own,
``ackkit-testkit`` (package ``ackkit_testkit``): throwaway RabbitMQ nodes (the
machine's ``rabbitmq-server``, 4.x in a Debian root), the kit's Docker image and a
throwaway PostgreSQL. ackkit itself ships without them; this module finds that
distribution when it is installed, or says how to get it."""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from types import ModuleType

from ._env import ENV_URL
from ._errors import BrokerUnavailable

__all__ = ["INSTALL", "TestkitMissing", "require", "testkit"]

DISTRIBUTION = "ackkit-testkit"
PACKAGE = "ackkit_testkit"
# Not on PyPI (nor is ackkit): it is the testkit/ directory of ackkit's checkout, and it
# pins the ackkit of that checkout; pip cannot find it by name.
INSTALL = "pip install /path/to/ackkit/testkit"
WHERE = f"{DISTRIBUTION} is the testkit/ directory of ackkit's checkout; it is not on PyPI"


class TestkitMissing(BrokerUnavailable):
    """Something only ackkit-testkit provides was asked for (a broker node, the kit's
    image, a throwaway PostgreSQL), and it is not installed."""

    __test__ = False  # not a pytest test class, whatever its name


def testkit() -> ModuleType | None:
    """The ``ackkit_testkit`` package, or None when it is not installed."""
    try:
        return importlib.import_module(PACKAGE)
    except ImportError as exc:
        if exc.name != PACKAGE:
            raise  # installed but broken: say so rather than pretend it is missing
        return None


def missing(what: str, instead: str = "", tried: Sequence[str] = ()) -> TestkitMissing:
    """The error for ``what`` (e.g. "a RabbitMQ node of the kit's own") without
    ackkit-testkit; ``instead``: the other way out (default: set ``AMQP_URL``);
    ``tried``: what was tried before (one line each)."""
    instead = instead or (
        f"set {ENV_URL} to a broker you run, e.g. "
        f"export {ENV_URL}=amqp://guest:guest@127.0.0.1:5672/%2f"
    )
    before = "".join(f"  - {line}\n" for line in tried)
    return TestkitMissing(
        (f"no RabbitMQ broker for the tests. Tried:\n{before}" if before else "")
        + f"{what} comes with the test kit's provisioning, a separate distribution that is not "
        f"installed. Either:\n"
        f"  * {INSTALL}   ({WHERE}; it adds throwaway RabbitMQ nodes, 4.x nodes in a "
        "Debian root, the kit's Docker image, a throwaway PostgreSQL), or\n"
        f"  * {instead}"
    )


def require(what: str, instead: str = "") -> ModuleType:
    """The ``ackkit_testkit`` package; :class:`TestkitMissing` (a ``BrokerUnavailable``)
    naming ``what`` and how to install it when it is not there."""
    kit = testkit()
    if kit is None:
        raise missing(what, instead)
    return kit
