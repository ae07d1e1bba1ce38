"""The public face: the exact names of the root and of each public submodule, a
docstring on every public name and member, the old root spellings (deprecated), and
what importing ackkit costs."""

from __future__ import annotations

import importlib
import inspect
import subprocess
import sys
import warnings

import pytest

import ackkit

PUBLIC = {
    "ackkit": [
        "AckIndex",
        "AckMode",
        "App",
        "AsyncApp",
        "AsyncDelivery",
        "Batch",
        "Consumer",
        "DeadLetterMessage",
        "Delivery",
        "Flow",
        "FlushPolicy",
        "Publication",
        "Queue",
        "RejectMessage",
        "RequeueMessage",
        "Retry",
        "RetryLater",
        "RetryStrategy",
        "TLS",
        "Unsettled",
        "__version__",
        "aconnect",
        "connect",
    ],
    "ackkit.errors": [
        "AckkitError",
        "AlreadySettled",
        "BadPayload",
        "ConsumeRefused",
        "DeadLetterMessage",
        "MessageUnroutable",
        "PublishError",
        "PublishNacked",
        "PublishNotConfirmed",
        "RejectMessage",
        "RequeueMessage",
        "RetryLater",
        "SettleNotAllowed",
        "TopologyConflict",
    ],
    "ackkit.flow": ["CircuitBreaker", "Flow", "FlowState", "KeySource", "RateLimit", "SerialKey"],
    "ackkit.topology": ["Bind", "Exchange", "ExchangeType"],
    "ackkit.dead_letters": [
        "DeadLetter",
        "DeadLetterQueue",
        "ReplayFilter",
        "ReplayReport",
        "inspect_dead_letters",
        "replay_dead_letters",
    ],
    "ackkit.observability": ["Event", "Stage", "mask_url"],
    "ackkit.pull": ["AsyncPullConnection", "PullConnection", "aconnect", "connect"],
}

# ackkit 0.1's root names that moved to a submodule: still there, deprecated.
MOVED = {
    n: m
    for m, names in PUBLIC.items()
    if m != "ackkit"
    for n in names
    if n not in PUBLIC["ackkit"] and n not in ("Flow",)
}


# Modules that never had root spellings (not in MOVED).
PUBLIC["ackkit.streams"] = [
    "StreamMessage",
    "StreamPublishError",
    "StreamPublisher",
    "partition_for",
    "send_confirmed",
    "stream_connection",
]
# What a broker provider outside ackkit (ackkit-testkit) builds on.
PUBLIC["ackkit.testing.providers"] = [
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


@pytest.mark.parametrize("module", sorted(PUBLIC))
def test_each_public_module_has_exactly_its_names(module: str) -> None:
    mod = importlib.import_module(module)
    assert mod.__all__ == PUBLIC[module]  # sorted, as listed above
    for name in mod.__all__:
        assert getattr(mod, name) is not None, name


def test_every_public_ackkit_object_in_the_package_namespace_is_in_all() -> None:
    public = {
        n
        for n, v in vars(ackkit).items()
        if not n.startswith("_") and getattr(v, "__module__", "").startswith("ackkit.")
    }
    assert public <= set(ackkit.__all__)


def _members(cls: type) -> dict[str, object]:
    """Public methods and properties, including those inherited from ackkit's classes."""
    out: dict[str, object] = {}
    for base in reversed(cls.__mro__):
        if base.__module__.startswith("ackkit"):
            for k, v in vars(base).items():
                if k.startswith("_"):
                    continue
                v = v.__func__ if isinstance(v, staticmethod | classmethod) else v
                if inspect.isfunction(v) or isinstance(v, property):
                    out[k] = v
    return out


def test_every_public_name_and_member_has_a_docstring() -> None:
    missing = []
    for module, names in PUBLIC.items():
        mod = importlib.import_module(module)
        assert (mod.__doc__ or "").strip(), module
        for name in names:
            obj = getattr(mod, name)
            if name.startswith("__"):
                continue
            if not (obj.__doc__ or "").strip():
                missing.append(f"{module}.{name}")
            if inspect.isclass(obj):
                missing += [
                    f"{module}.{name}.{k}"
                    for k, v in _members(obj).items()
                    if not (getattr(v, "__doc__", None) or "").strip()
                ]
    assert missing == []


@pytest.mark.parametrize("name", sorted(MOVED))
def test_old_root_names_still_work_with_a_warning_naming_the_new_place(name: str) -> None:
    module = MOVED[name]
    with pytest.warns(DeprecationWarning, match=rf"use {module}\.{name}\b") as caught:
        value = getattr(ackkit, name)
    assert caught[0].filename == __file__
    assert value is getattr(importlib.import_module(module), name)


def test_an_old_root_import_warns_once_at_the_import_line() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        from ackkit import BadPayload  # noqa: F401
    assert [(w.category, w.filename) for w in caught] == [(DeprecationWarning, __file__)]


def test_unknown_root_names_are_attribute_errors() -> None:
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        ackkit.Nope  # noqa: B018


def test_importing_ackkit_imports_no_optional_dependency() -> None:
    """Metrics, tracing, asyncio and Spark support load only when asked for."""
    code = (
        "import sys, ackkit, ackkit.tracing; "
        "heavy = ('prometheus_client', 'opentelemetry', 'aio_pika', 'pyspark', 'typer'); "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in heavy))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "[]"
