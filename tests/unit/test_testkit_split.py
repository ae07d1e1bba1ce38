"""ackkit.testing without ackkit-testkit (the separate distribution that starts brokers
and PostgreSQL): the in-memory broker and the AMQP_URL broker still work, and asking for
anything the kit would start says `pip install /path/to/ackkit/testkit` (or what to set instead)."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

from ackkit.testing import (
    BrokerUnavailable,
    InMemoryBroker,
    NodeTLS,
    _docker_engine,
    _kit,
    _pg,
    provision_broker,
)
from ackkit.testing import _broker as broker_mod


@pytest.fixture
def no_testkit(monkeypatch: pytest.MonkeyPatch) -> None:
    """As if ackkit-testkit were not installed (import ackkit_testkit fails)."""
    monkeypatch.setitem(sys.modules, "ackkit_testkit", None)
    monkeypatch.delenv("AMQP_URL", raising=False)
    monkeypatch.delenv("ACKKIT_TEST_BROKER", raising=False)
    monkeypatch.delenv("ACKKIT_TEST_POSTGRES_DSN", raising=False)
    monkeypatch.setattr(broker_mod, "_docker_engine", lambda: (False, "no engine (test)"))


def test_a_broker_without_amqp_url_says_pip_install_ackkit_testkit(no_testkit: None) -> None:
    assert _kit.testkit() is None
    with pytest.raises(BrokerUnavailable) as info:
        provision_broker()
    text = str(info.value)
    assert "pip install /path/to/ackkit/testkit" in text
    assert "AMQP_URL" in text and "no engine (test)" in text
    for mode, kwargs in (("own", {}), (None, {"rabbitmq": "4.3"})):
        with pytest.raises(_kit.TestkitMissing, match="pip install /path/to/ackkit/testkit"):
            provision_broker(mode, **kwargs)
    with pytest.raises(_kit.TestkitMissing, match="pip install /path/to/ackkit/testkit"):
        provision_broker(tls=NodeTLS("ca.pem", "cert.pem", "key.pem"))
    assert broker_mod._find_rabbitmq_server() is None


def test_the_in_memory_broker_needs_no_testkit(no_testkit: None) -> None:
    with InMemoryBroker() as broker:
        conn = broker.connect()
        conn.channel().queue_declare("orders")
        conn.close()
        broker.publish("orders", b"x")
        assert broker.counts("orders").ready == 1


def test_postgres_without_testkit(no_testkit: None, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(_kit.TestkitMissing) as info:
        _pg.provision_postgres()
    assert "pip install /path/to/ackkit/testkit" in str(info.value)
    assert "ACKKIT_TEST_POSTGRES_DSN" in str(info.value)
    monkeypatch.setenv("ACKKIT_TEST_POSTGRES_DSN", "postgresql://u:secret@db.invalid/x")
    h = _pg.provision_postgres()
    assert h.dsn == "postgresql://u:secret@db.invalid/x" and not h.own
    assert "secret" not in repr(h)
    with pytest.raises(RuntimeError, match="only the kit's own"):
        h.stop()
    h.close()


class _Engine:
    def __init__(self, images: set[str]) -> None:
        self.images = self
        self._images = images

    def get(self, name: str) -> str:
        import docker.errors

        if name not in self._images:
            raise docker.errors.ImageNotFound(name)
        return name


def test_docker_image_choice_without_testkit(
    no_testkit: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No testkit to build the kit's image: an existing one is used, else the official
    image (an engine without a bridge too), and asking for a missing kit image by name
    says how to get the builder."""
    monkeypatch.delenv("ACKKIT_TEST_RABBITMQ_IMAGE", raising=False)
    bare: Any = _Engine(set())
    local: Any = _Engine({"ackkit-test/rabbitmq:4.3"})
    assert _docker_engine.choose_image(bare, "host") == "rabbitmq:4.3"
    assert _docker_engine.choose_image(bare, "bridge") == "rabbitmq:4.3"
    assert _docker_engine.choose_image(local, "host") == "ackkit-test/rabbitmq:4.3"
    monkeypatch.setenv("ACKKIT_TEST_RABBITMQ_IMAGE", "ackkit-test/rabbitmq:4.3")
    assert _docker_engine.choose_image(local, "bridge") == "ackkit-test/rabbitmq:4.3"
    with pytest.raises(_kit.TestkitMissing, match="pip install /path/to/ackkit/testkit"):
        _docker_engine.choose_image(bare, "bridge")


def test_importing_the_kit_and_its_plugin_loads_no_provisioning() -> None:
    """ackkit_testkit is imported only when a test asks for something it starts."""
    code = (
        "import sys, ackkit.testing, ackkit.testing.plugin; "
        "print(sorted(m for m in sys.modules if m.startswith('ackkit_testkit')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "[]"


def test_a_broken_testkit_is_not_taken_for_a_missing_one(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(name: str) -> Any:
        raise ModuleNotFoundError("No module named 'somedep'", name="somedep")

    monkeypatch.setattr(_kit.importlib, "import_module", broken)
    with pytest.raises(ModuleNotFoundError, match="somedep"):
        _kit.testkit()


def test_the_testkit_imports_no_private_name_of_ackkit_testing() -> None:
    """ackkit-testkit builds on ackkit.testing's public names and ackkit.testing.providers;
    its private modules and names may change without it noticing otherwise."""
    import ast
    import pathlib

    import ackkit.testing.providers as providers

    root = pathlib.Path(__file__).resolve().parents[2] / "testkit" / "ackkit_testkit"
    private = []
    for path in sorted(root.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("ackkit"):
                parts = (node.module or "").split(".")
                names = [a.name for a in node.names]
                if any(p.startswith("_") for p in parts) or any(n.startswith("_") for n in names):
                    private.append(f"{path.name}:{node.lineno}: {node.module} {names}")
            elif isinstance(node, ast.Import):
                private += [
                    f"{path.name}:{node.lineno}: {a.name}"
                    for a in node.names
                    if a.name.startswith("ackkit.") and "._" in a.name
                ]
    assert private == []
    assert providers.__all__ == sorted(providers.__all__)
    for name in providers.__all__:
        assert getattr(providers, name) is not None, name
