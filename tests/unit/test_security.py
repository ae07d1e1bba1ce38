"""Security basics without a broker: no code-executing deserialisation in ackkit, the
TLS value, masked URLs."""

from __future__ import annotations

import ast
import ssl
from pathlib import Path

import pytest

import ackkit
from ackkit import TLS, App, AsyncApp
from ackkit._connection.tls import client_tls, handshake_hint, tls_failure
from tests.unit._fakes import parse_source

PACKAGE = Path(ackkit.__file__).parent

# Modules whose loading of data can run code, and calls that run code from a string.
FORBIDDEN_MODULES = {"pickle", "cPickle", "_pickle", "marshal", "shelve", "dill", "cloudpickle",
                     "jsonpickle", "joblib"}  # fmt: skip
FORBIDDEN_CALLS = {"eval", "exec", "compile", "__import__"}
YAML_UNSAFE = {"load", "load_all", "unsafe_load", "unsafe_load_all", "full_load", "full_load_all"}


def _sources() -> list[Path]:
    files = sorted(PACKAGE.rglob("*.py"))
    assert len(files) > 20
    return files


def _findings(path: Path) -> list[str]:
    tree = parse_source(path)
    out = []
    for node in ast.walk(tree):
        where = f"{path.name}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in FORBIDDEN_MODULES:
                    out.append(f"{where} import {alias.name}")
        elif isinstance(node, ast.ImportFrom):
            if (node.module or "").split(".")[0] in FORBIDDEN_MODULES:
                out.append(f"{where} from {node.module} import ...")
        elif isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Name) and f.id in FORBIDDEN_CALLS:
                out.append(f"{where} {f.id}(...)")
            if isinstance(f, ast.Attribute):
                owner = f.value.id if isinstance(f.value, ast.Name) else ""
                if owner == "yaml" and f.attr in YAML_UNSAFE:
                    out.append(f"{where} yaml.{f.attr}(...)")
                if owner in FORBIDDEN_MODULES:
                    out.append(f"{where} {owner}.{f.attr}(...)")
    return out


def test_no_code_executing_deserialisation_anywhere_in_ackkit() -> None:
    """Bodies, headers and files are read as bytes, JSON or pydantic models only."""
    found = [f for path in _sources() for f in _findings(path)]
    assert found == []


def test_the_scan_would_see_it(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("import pickle\nimport yaml\nx = eval('1')\nyaml.load(s)\npickle.loads(b'')\n")
    assert len(_findings(bad)) == 4


# -- TLS value ---------------------------------------------------------------------------


def test_amqps_without_tls_verifies_against_the_system_trust_store() -> None:
    conf = client_tls("amqps://u:p@mq.example.com/%2f", None)
    assert conf is not None
    ctx, host = conf
    assert ctx.verify_mode is ssl.CERT_REQUIRED and ctx.check_hostname
    assert ctx.minimum_version >= ssl.TLSVersion.TLSv1_2
    assert host == "mq.example.com"


def test_plain_amqp_has_no_tls_and_refuses_a_tls_setting() -> None:
    assert client_tls("amqp://u:p@h/%2f", None) is None
    with pytest.raises(ValueError, match="not an amqps:// URL") as info:
        App("amqp://u:secret@h/%2f", tls=TLS())
    assert "secret" not in str(info.value)
    with pytest.raises(ValueError, match="not an amqps:// URL"):
        AsyncApp("amqp://u:secret@h/%2f", tls=TLS())


def test_server_hostname_and_context_pass_through() -> None:
    conf = client_tls("amqps://h:5671/%2f", TLS(server_hostname="mq.internal"))
    assert conf is not None and conf[1] == "mq.internal"
    mine = ssl.create_default_context()
    assert client_tls("amqps://h/%2f", mine) == (mine, "h")


def test_missing_files_fail_when_the_app_is_made(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="TLS files could not be loaded"):
        App("amqps://h/%2f", tls=TLS(ca_file=str(tmp_path / "nope.pem")))
    with pytest.raises(ValueError, match="needs cert_file"):
        TLS(key_file="k.pem")


def test_key_password_is_not_in_the_repr() -> None:
    t = TLS(cert_file="c.pem", key_file="k.pem", key_password="hunter2")
    assert "hunter2" not in repr(t)


def test_certificate_failures_are_found_inside_wrapping_errors() -> None:
    inner = ssl.SSLCertVerificationError(1, "certificate verify failed")
    inner.verify_message = "unable to get local issuer certificate"
    outer = ConnectionError("workflow failed")
    outer.exceptions = [RuntimeError("x"), OSError(inner)]  # type: ignore[attr-defined]
    msg = tls_failure(outer, "amqps://u:secret@h/%2f")
    assert msg is not None and "unable to get local issuer certificate" in msg
    assert "secret" not in msg and "amqps://u:***@h/%2f" in msg
    text = "StreamLostError: SSLError(1, '[SSL: TLSV13_ALERT_CERTIFICATE_REQUIRED] ...')"
    msg = tls_failure(ConnectionError(text), "amqps://h/%2f")
    assert msg == (
        "TLS: the broker requires a client certificate "
        "(amqps://h/%2f: TLSV13_ALERT_CERTIFICATE_REQUIRED)"
    )
    assert tls_failure(ConnectionResetError("reset by peer"), "amqps://h/%2f") is None
    assert "client certificate" in handshake_hint(ConnectionResetError("reset"), "amqps://h/")
    assert handshake_hint(ConnectionResetError("reset"), "amqp://h/") == ""


def test_app_repr_masks_the_password() -> None:
    for cls in (App, AsyncApp):
        app = cls("amqp://user:pa%3Ass@h:5672/%2f")
        assert "pa%3Ass" not in repr(app) and "user:***@h" in repr(app)
