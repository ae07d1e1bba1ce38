"""The adversarial suite: hostile producers, misbehaving handlers and plain misuse.

Every test here runs against a real broker and, where the behaviour belongs to
a listener, on both runtimes (the contract harness's `runtime` fixture: the
pika App and AsyncApp). What a test asserts comes from the broker: queue
counts, what the dead-letter queue holds and its headers, how often a handler
ran. Modules are named for the class of abuse they try.
"""

from __future__ import annotations

import pytest

from tests.contract.conftest import (  # noqa: F401  (fixtures, re-exported for this suite)
    broker,
    loop_thread,
    runtime,
)


@pytest.fixture
def transport() -> str:
    """The contract harness's transport: this suite runs on real brokers only."""
    return "rabbitmq"
