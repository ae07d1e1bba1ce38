"""Shared pytest setup for ackkit's own test suite.

The ackkit test kit (fixtures ``rabbitmq``, ``amqp_url``, ``queue_factory``,
``fresh_queue``, ``own_rabbitmq``) is normally loaded through its ``pytest11``
entry point (the package is installed editable in .venv). When plugin
autoloading is off (PYTEST_DISABLE_PLUGIN_AUTOLOAD=1) it is registered here,
under the same name, so it is never registered twice.
"""

from __future__ import annotations

import importlib

import pytest
from hypothesis import HealthCheck, settings

# Property tests check what comes out, not how fast: on a 2-core machine running three
# broker legs side by side an example may take longer than hypothesis's 200 ms default
# (a DeadlineExceeded there says nothing about the code under test).
settings.register_profile("ackkit", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("ackkit")


def pytest_configure(config: pytest.Config) -> None:
    plugin = importlib.import_module("ackkit.testing.plugin")
    if not config.pluginmanager.is_registered(plugin) and not config.pluginmanager.is_blocked(
        "ackkit"
    ):
        config.pluginmanager.register(plugin, "ackkit")
